package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// minimalBwrapArgs are the options of issue 37's yardstick: the cheapest
// bwrap spawn that still makes every namespace, with none of boxrt's
// hardening (no user switch, seccomp, cgroup or argument memfd). A session
// that is entered rather than spawned is measured against it.
var minimalBwrapArgs = []string{
	"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
	"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
	"--unshare-all", "--die-with-parent", "--new-session",
}

// runMinimalBwrap runs argv in the minimal bwrap sandbox and returns its
// standard output.
func runMinimalBwrap(ctx context.Context, argv ...string) (string, error) {
	args := append(append([]string{}, minimalBwrapArgs...), argv...)
	return runCmd(ctx, "bwrap", args...)
}

// sessionPSSKiB is the proportional set size, summed, of pid and every
// process below it: boxrt with the sandboxes and agents it runs. PSS
// splits shared pages (the agent's text, libc) among their users, so the
// sum divided by a number of sessions is what each one really costs the
// host.
func sessionPSSKiB(pid int) (kib int64, procs int, err error) {
	children, err := childrenOf()
	if err != nil {
		return 0, 0, err
	}
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if v, err := pssKiB(p); err == nil {
			kib += v
			procs++
		}
		queue = append(queue, children[p]...)
	}
	if procs == 0 {
		return 0, 0, fmt.Errorf("process %d is gone", pid)
	}
	return kib, procs, nil
}

// childrenOf maps every process to its children, from /proc/*/stat.
func childrenOf() (map[int][]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// the command name may hold spaces and parentheses: fields
		// start after the last ')'
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			out[ppid] = append(out[ppid], pid)
		}
	}
	return out, nil
}

// pssKiB reads a process's Pss from smaps_rollup.
func pssKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no Pss in /proc/%d/smaps_rollup", pid)
}
