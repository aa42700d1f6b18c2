package bwrap

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// procState is the state letter of /proc/<pid>/stat (0 when unreadable).
func procState(pid int) rune {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 || i+2 >= len(data) {
		return 0
	}
	return rune(data[i+2])
}

// ppidOf reads a process's parent pid from /proc (-1 when gone).
func ppidOf(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	return parseStatPPID(string(data))
}

// parseStatPPID extracts the ppid from /proc/<pid>/stat: "pid (comm) state
// ppid …", where comm may itself contain spaces and parentheses.
func parseStatPPID(stat string) int {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return -1
	}
	// " state ppid …"
	_, rest, ok := strings.Cut(strings.TrimLeft(stat[i+1:], " "), " ")
	if !ok {
		return -1
	}
	ppid, _, _ := strings.Cut(rest, " ")
	pp, err := strconv.Atoi(ppid)
	if err != nil {
		return -1
	}
	return pp
}

// nsPidOf is pid's pid in its own (innermost) pid namespace, from
// /proc/<pid>/status, or -1 when it is in boxrt's own namespace (or gone).
func nsPidOf(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) < 2 {
				return -1
			}
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// children lists the direct children of pid. The kernel lists a task's
// children in /proc/<pid>/task/<tid>/children, exact while they cannot
// fork or exit under the reading (the callers' cases: bwrap stopped, or
// its one child, the namespace init); reading it costs the same with any
// number of processes on the host, where the scan of every /proc/<pid>/stat
// that kernels without it need costs one read per process, and a host
// with a thousand sandboxes runs ten thousand.
func children(pid int) []int {
	if !taskChildrenListed() {
		return scanChildren(pid)
	}
	task := "/proc/" + strconv.Itoa(pid) + "/task/"
	tids, err := os.ReadDir(task)
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tids {
		data, err := os.ReadFile(task + t.Name() + "/children")
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// taskChildrenListed reports whether the kernel lists children per task
// (CONFIG_PROC_CHILDREN).
var taskChildrenListed = sync.OnceValue(func() bool {
	_, err := os.Stat("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/children")
	return err == nil
})

// scanChildren lists the direct children of pid from every process's stat.
func scanChildren(pid int) []int {
	var out []int
	forEachProc(func(p, ppid int) {
		if ppid == pid {
			out = append(out, p)
		}
	})
	return out
}

// forEachProc calls fn with every process's pid and parent pid.
func forEachProc(fn func(pid, ppid int)) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if pp := parseStatPPID(string(data)); pp >= 0 {
			fn(p, pp)
		}
	}
}

// descendants lists the transitive children of pid from /proc (used to
// find the sandbox's processes when there is no cgroup).
func descendants(pid int) []int {
	children := map[int][]int{}
	forEachProc(func(p, pp int) { children[pp] = append(children[pp], p) })
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !slices.Contains(out, c) {
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}
