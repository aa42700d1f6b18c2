package bwrap

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

// requireRoot skips loudly: cgroupfs is only ours to write as root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: needs root to manage cgroups")
	}
}

// sandboxPids finds the host pids whose command line holds marker, waiting
// up to 5s for want of them.
func sandboxPids(t *testing.T, marker string, want int) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var pids []string
		for _, p := range hostProcsWith(marker) {
			pid, _, _ := strings.Cut(p, ":")
			pids = append(pids, pid)
		}
		if len(pids) >= want || time.Now().After(deadline) {
			return pids
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// residentPids lists the processes of a session's resident sandbox: bwrap
// and its descendants.
func residentPids(b *Backend, info backends.Session) []string {
	res := &b.files(info.BackendSessionID).res
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.r == nil {
		return nil
	}
	res.r.mu.Lock()
	outer := res.r.cmd.Process.Pid
	res.r.mu.Unlock()
	pids := []string{fmt.Sprint(outer)}
	for _, p := range descendants(outer) {
		pids = append(pids, fmt.Sprint(p))
	}
	return pids
}

// TestCgroupPlacement checks that every process of a sandbox — bwrap
// itself included — is in the exec's leaf in every hierarchy we use.
func TestCgroupPlacement(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	b := newBackend(t)
	if b.cg.version == cgroupNone {
		t.Fatalf("running as root but no cgroup interface was found usable: %q", b.cg.notes)
	}
	info := newSession(t, b, nil)
	marker := mark("30.0451")
	done := make(chan execResult, 1)
	go func() {
		done <- execIn(t, b, info, backends.ExecRequest{Cmd: "sleep " + marker, Timeout: 20 * time.Second})
	}()
	// The command runs once its sleep does; then bwrap, its init, the
	// agent, the shell and sleep are the sandbox's processes.
	if pids := sandboxPids(t, marker, 1); len(pids) < 1 {
		t.Fatalf("the command's process not found")
	}
	pids := residentPids(b, info)
	if len(pids) < 4 {
		t.Fatalf("sandbox processes not found: %v", pids)
	}
	leafPrefix := "/" + cgroupParentName + "/" + b.cfg.InstanceID + "/" + info.BackendSessionID + "."
	for _, pid := range pids {
		data, err := os.ReadFile("/proc/" + pid + "/cgroup")
		if err != nil {
			continue // exited meanwhile
		}
		for _, c := range b.cg.controllers {
			found := false
			for _, line := range strings.Split(string(data), "\n") {
				parts := strings.SplitN(line, ":", 3)
				if len(parts) != 3 {
					continue
				}
				ctrls := strings.Split(parts[1], ",")
				if (b.cg.version == cgroupV2 && parts[1] == "") || (b.cg.version == cgroupV1 && slices.Contains(ctrls, c)) {
					found = strings.Contains(parts[2], leafPrefix)
				}
			}
			if !found {
				t.Errorf("pid %s is not in its %s leaf %s…:\n%s", pid, c, leafPrefix, data)
			}
		}
	}
	// limits were written
	leaves := b.cg.leaves(b.cfg.InstanceID)
	if len(leaves) != 1 {
		t.Fatalf("want one leaf while the exec runs, got %v", leaves)
	}
	// The session defaults: 512 MiB, 128 pids (+ bwrap and the agent),
	// 1 cpu.
	pidsMax := fmt.Sprint(128 + pidsOverhead)
	want := map[cgroupVersion]map[string][2]string{
		cgroupV1: {"memory": {"memory.limit_in_bytes", "536870912"}, "pids": {"pids.max", pidsMax}, "cpu": {"cpu.cfs_quota_us", "100000"}},
		cgroupV2: {"memory": {"memory.max", "536870912"}, "pids": {"pids.max", pidsMax}, "cpu": {"cpu.max", "100000 100000"}},
	}[b.cg.version]
	// The thread that forked bwrap went back home (v1 moves it as "0",
	// itself): no thread of ours is left in the leaf.
	own, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range b.cg.bases {
		dir := filepath.Join(base.dir, cgroupParentName, b.cfg.InstanceID, leaves[0])
		inLeaf := readWords(filepath.Join(dir, "tasks"))
		if b.cg.version == cgroupV2 {
			inLeaf = readWords(filepath.Join(dir, "cgroup.threads"))
		}
		for _, tk := range own {
			if slices.Contains(inLeaf, tk.Name()) {
				t.Errorf("thread %s of the test process is still in %s", tk.Name(), dir)
			}
		}
		for _, c := range base.controllers {
			w := want[c]
			if got := strings.TrimSpace(readString(filepath.Join(dir, w[0]))); got != w[1] {
				t.Errorf("%s: %s = %q, want %q", dir, w[0], got, w[1])
			}
		}
	}
	if err := b.StopSession(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	<-done
	assertNoHostProcs(t, "sleep "+marker)
}

// unifiedMount finds a cgroup2 mount other than the one detectCgroups
// chose, e.g. the controller-less /sys/fs/cgroup/unified of a hybrid host.
func unifiedMount(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	return ""
}

// TestCgroupV2Mechanics drives the cgroup v2 code path (CLONE_INTO_CGROUP
// placement, cgroup.kill, leaf removal) on whatever v2 hierarchy exists
// here, even one without controllers (then no limit is enforced, which is
// what Describe must say).
func TestCgroupV2Mechanics(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	mount := unifiedMount(t)
	if mount == "" {
		t.Skip("SKIPPED: no cgroup2 hierarchy mounted on this machine")
	}
	b := newBackend(t)
	b.cg = setupV2(mount, b.cfg.InstanceID)
	if b.cg.version != cgroupV2 {
		t.Fatalf("setupV2(%s) failed: %q", mount, b.cg.notes)
	}
	t.Cleanup(func() {
		// v2 parents are kept by design; a test's are not (rmdir only
		// removes them when empty, so a real installation's stay).
		_ = syscall.Rmdir(filepath.Join(mount, cgroupParentName, b.cfg.InstanceID))
		_ = syscall.Rmdir(filepath.Join(mount, cgroupParentName))
	})
	t.Logf("v2 at %s, controllers %v, enforced %v, cgroup.kill %v", mount, b.cg.controllers, b.Describe().EnforcedLimits, b.cg.v2Kill)
	if len(b.cg.controllers) == 0 && len(b.Describe().EnforcedLimits) != 0 {
		t.Fatalf("no controllers but Describe claims %v", b.Describe().EnforcedLimits)
	}
	info := newSession(t, b, nil)
	for _, cloneInto := range []bool{true, false} {
		t.Run(fmt.Sprintf("cloneInto=%v", cloneInto), func(t *testing.T) {
			// false: the join script, as on kernels without CLONE_INTO_CGROUP
			b.cg.noCloneInto.Store(!cloneInto)
			b.files(info.BackendSessionID).res.close() // the next exec starts the sandbox this way
			if got := mustRun(t, b, info, "echo v2"); got != "v2\n" {
				t.Fatalf("exec: %q", got)
			}
			marker := mark("60.0457")
			done := make(chan execResult, 1)
			go func() {
				done <- execIn(t, b, info, backends.ExecRequest{Cmd: "sleep " + marker + " & sleep " + marker, Timeout: 1500 * time.Millisecond})
			}()
			if pids := sandboxPids(t, marker, 2); len(pids) < 2 {
				t.Fatalf("the command's processes not found: %v", pids)
			}
			pids := residentPids(b, info)
			if len(pids) < 5 {
				t.Fatalf("sandbox processes not found: %v", pids)
			}
			leaf := "/" + cgroupParentName + "/" + b.cfg.InstanceID + "/" + info.BackendSessionID + "."
			for _, pid := range pids {
				data, _ := os.ReadFile("/proc/" + pid + "/cgroup")
				if !strings.Contains(string(data), "0::"+leaf) && len(data) > 0 {
					t.Errorf("pid %s not placed into its v2 leaf:\n%s", pid, data)
				}
			}
			r := <-done
			if r.err != nil || !r.status.TimedOut {
				t.Fatalf("want a timeout: %+v %v", r.status, r.err)
			}
			assertNoHostProcs(t, "sleep "+marker)

			p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{Command: "sh", Args: []string{"-c", "sleep " + marker + " & sleep " + marker}})
			if err != nil {
				t.Fatal(err)
			}
			sandboxPids(t, marker, 2)
			if err := p.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code, err := waitWithin(t, p, 5*time.Second); err != nil || code != -15 {
				t.Fatalf("Wait = %d, %v", code, err)
			}
			assertNoHostProcs(t, "sleep "+marker)
			_ = p.Stdin().Close()
			_, _ = io.ReadAll(p.Stdout())
			_, _ = io.ReadAll(p.Stderr())
		})
	}
}

// TestAdoptRemovesStaleCgroups: leaves of an earlier boxrt process of the
// same installation are cleaned up; our own live ones are not.
func TestAdoptRemovesStaleCgroups(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	b := newBackend(t)
	if b.cg.version == cgroupNone {
		t.Skip("SKIPPED: no usable cgroups here")
	}
	info := newSession(t, b, nil)
	stale := info.BackendSessionID + ".deadbeef.x1"
	for _, base := range b.cg.bases {
		if _, err := b.cg.mkLeaf(base, b.cfg.InstanceID, stale); err != nil {
			t.Fatal(err)
		}
	}
	marker := mark("60.0461")
	done := make(chan execResult, 1)
	go func() {
		done <- execIn(t, b, info, backends.ExecRequest{Cmd: "sleep " + marker, Timeout: 20 * time.Second})
	}()
	sandboxPids(t, marker, 3)
	if _, err := b.Adopt(context.Background()); err != nil {
		t.Fatal(err)
	}
	leaves := b.cg.leaves(b.cfg.InstanceID)
	if len(leaves) != 1 || leaves[0] == stale {
		t.Fatalf("after Adopt leaves = %v; want only the running exec's", leaves)
	}
	if got := hostProcsWith("sleep " + marker); len(got) == 0 {
		t.Fatal("Adopt killed a live exec of its own Backend")
	}
	if err := b.StopSession(context.Background(), info); err != nil {
		t.Fatal(err)
	}
	<-done
}

// TestQuickExecsKeepThePidsLimit: every exec of a session shares the
// session's cgroup with its resident sandbox (bwrap, its init, the
// agent's threads, which pidsOverhead leaves room for). A quick series of
// execs must not pile their exited processes up against the session's pids
// limit, even the least: the agent reaps each at once, and its threads
// never take the commands' room.
func TestQuickExecsKeepThePidsLimit(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	b := newBackend(t)
	if !slices.Contains(b.Describe().EnforcedLimits, limitPids) {
		t.Skip("SKIPPED: the pids limit is not enforced here")
	}
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.PidsLimit = 1 })
	for i := range 60 {
		r := execIn(t, b, info, backends.ExecRequest{Cmd: "true"})
		if r.err != nil || r.status.ExitCode != 0 {
			t.Fatalf("exec %d of a quick series: err=%v status=%+v stderr=%q", i, r.err, r.status, r.stderr)
		}
	}
}

// TestCommandsShareTheSandboxLeaf: a command and what it forks are born
// in the session's own cgroup (the root of its cgroup namespace), where the
// agent is: nothing is moved per command or per sandbox.
func TestCommandsShareTheSandboxLeaf(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	b := newBackend(t)
	if !slices.Contains(b.Describe().EnforcedLimits, limitPids) {
		t.Fatal("the pids limit is not enforced here: this machine has a pids hierarchy")
	}
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.PidsLimit = 16 })
	got := mustRun(t, b, info, "grep :pids: /proc/self/cgroup; sh -c 'grep :pids: /proc/self/cgroup'")
	if lines := strings.Split(strings.TrimSpace(got), "\n"); len(lines) != 2 || !strings.HasSuffix(lines[0], ":pids:/") || lines[1] != lines[0] {
		t.Fatalf("the command and its child are not in the sandbox's own cgroup: %q", got)
	}
}
