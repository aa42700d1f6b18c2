package procstat

import (
	"os"
	"strconv"
	"strings"
)

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
