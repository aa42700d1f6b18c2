package bwrap

import (
	"os"
	"slices"
	"strconv"
	"strings"
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
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return -1
	}
	pp, err := strconv.Atoi(f[1])
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

// children lists the direct children of pid from /proc.
func children(pid int) []int {
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
