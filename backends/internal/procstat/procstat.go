package procstat

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// maxLines bounds the interfaces read.
const maxLines = 1024

// Net sums the received and sent bytes of every interface but lo in the
// net/dev file at path; 0, 0 when it cannot be read.
func Net(path string) (rx, tx int64) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 0; sc.Scan() && n < maxLines; n++ {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(name) == "lo" {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) < 9 {
			continue
		}
		r, err1 := strconv.ParseInt(fields[0], 10, 64)
		t, err2 := strconv.ParseInt(fields[8], 10, 64)
		if err1 == nil && err2 == nil {
			rx += r
			tx += t
		}
	}
	return rx, tx
}

// OOMKills is how many processes the memory cgroup of process pid has
// seen its limit kill (cgroup v1 memory.oom_control or v2 memory.events);
// -1 when it cannot be read.
func OOMKills(pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || strings.Contains(parts[2], "..") {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			return counter("/sys/fs/cgroup"+parts[2]+"/memory.events", "oom_kill")
		case hasController(parts[1], "memory"):
			return counter("/sys/fs/cgroup/memory"+parts[2]+"/memory.oom_control", "oom_kill")
		}
	}
	return -1
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// counter reads "key N" from a flat-keyed file; -1 when absent.
func counter(path, key string) int64 {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return n
			}
		}
	}
	return -1
}
