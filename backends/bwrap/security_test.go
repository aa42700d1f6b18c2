package bwrap

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// Regression tests for attacks on the bwrap backend run as root. Each
// reproduces the attack against the real backend; the "victim" directory
// stands in for /etc.

// TestHostPathSwappedForSymlink: session A (rw on an allowed directory)
// replaces the sub-directory session B mounts with a symlink to the
// victim; B's next exec or managed process must still mount the directory
// it was created with, never the symlink's target.
func TestHostPathSwappedForSymlink(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	cases := []struct {
		name string
		run  func(t *testing.T, info backends.Session, cmd string)
	}{
		{"exec", func(t *testing.T, info backends.Session, cmd string) {
			r := execIn(t, b, info, backends.ExecRequest{Cmd: cmd})
			t.Logf("exec: err=%v status=%+v stderr=%q", r.err, r.status, r.stderr)
		}},
		{"managed process", func(t *testing.T, info backends.Session, cmd string) {
			p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{Command: "/bin/sh", Args: []string{"-c", cmd}})
			if err != nil {
				t.Logf("start refused: %v", err)
				return
			}
			p.Stdin().Close()
			go func() { _, _ = io.Copy(io.Discard, p.Stdout()) }()
			go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
			code, err := p.Wait()
			t.Logf("process: code=%d err=%v", code, err)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			allowed, victim := backendtest.ReachableDir(t), backendtest.ReachableDir(t)
			sub := filepath.Join(allowed, "sub")
			if err := os.Mkdir(sub, 0o755); err != nil || os.Chmod(sub, 0o777) != nil {
				t.Fatal(err)
			}
			attacker := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = "a-" + tc.name; s.HostPath = allowed })
			target := newSession(t, b, func(s *backends.SandboxSpec) {
				s.SessionID = "b-" + tc.name
				s.ExtraMounts = []backends.MountSpec{{HostPath: sub, MountPath: "/data", Mode: backends.MountRW}}
			})
			mustRun(t, b, attacker, "mv /workspace/sub /workspace/sub.old && ln -s "+victim+" /workspace/sub")
			tc.run(t, target, "touch /data/pwned")
			if _, err := os.Lstat(filepath.Join(victim, "pwned")); err == nil {
				t.Fatal("the session's mount followed the planted symlink: a file was created in the victim directory")
			}
			if _, err := os.Lstat(filepath.Join(allowed, "sub.old", "pwned")); err != nil {
				t.Fatalf("the session no longer writes to the directory it was created with: %v", err)
			}
		})
	}
}

// TestPlantedMountPointSymlink: a command makes /workspace/.skills a
// relative symlink into ../../oldroot/<victim> (the host's root while
// bwrap builds the sandbox); the next exec's skill mount must not create
// anything there.
func TestPlantedMountPointSymlink(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	victim, skill := backendtest.ReachableDir(t), backendtest.ReachableDir(t)
	info := newSession(t, b, nil)
	mustRun(t, b, info, "ln -s ../../oldroot"+victim+" /workspace/.skills")
	withSkill := info
	withSkill.ExtraMounts = []backends.MountSpec{{HostPath: skill, MountPath: "/workspace/.skills/demo", Mode: backends.MountRO}}
	r := execIn(t, b, withSkill, backends.ExecRequest{Cmd: "true"})
	t.Logf("exec with the skill: err=%v status=%+v stderr=%q", r.err, r.status, r.stderr)
	if entries, _ := os.ReadDir(victim); len(entries) > 0 {
		t.Fatalf("the skill mount followed the planted symlink and created %v in the victim directory", entries[0].Name())
	}
	if r.err == nil && r.status.ExitCode == 0 {
		t.Fatal("the exec ran although its mount point is a symlink")
	}
}

// TestSandboxIsNotHostRoot: uid 0 inside is an unprivileged host user:
// the sandbox's processes have that host uid, and what they create on the
// session's disk is that user's. (An rw host directory is idmapped: there
// the files land as the directory owner's, root's here, as with Docker.)
func TestSandboxIsNotHostRoot(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	data := t.TempDir() // root's, 0700: writable through the idmapped mount
	info := newSession(t, b, func(s *backends.SandboxSpec) {
		s.ExtraMounts = []backends.MountSpec{{HostPath: data, MountPath: "/data", Mode: backends.MountRW}}
	})
	want := os.Getuid()
	if os.Geteuid() == 0 {
		u, err := user.Lookup(SandboxUser)
		if err != nil {
			t.Fatal(err)
		}
		want, _ = strconv.Atoi(u.Uid)
	}
	marker := mark("3000.0")
	p, err := b.StartProcess(context.Background(), info, backends.ProcessSpec{Command: "sh", Args: []string{"-c", "touch /workspace/f /data/g && id -u && exec sleep " + marker}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = p.Signal(syscall.SIGKILL)
		_, _ = p.Wait()
	}()
	p.Stdin().Close()
	go func() { _, _ = io.Copy(io.Discard, p.Stderr()) }()
	line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
	if err != nil || line != "0\n" {
		t.Fatalf("uid inside: %q %v", line, err)
	}
	procs := hostProcsWith(marker)
	if len(procs) == 0 {
		t.Fatal("the sandboxed process is not visible on the host")
	}
	for _, proc := range procs {
		pid, _, _ := strings.Cut(proc, ":")
		status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		if err != nil {
			continue // gone meanwhile
		}
		for _, l := range strings.Split(string(status), "\n") {
			if f := strings.Fields(l); len(f) == 5 && f[0] == "Uid:" {
				for _, id := range f[1:] {
					if id != strconv.Itoa(want) {
						t.Errorf("process %s runs as host uids %v, want all %d", proc, f[1:], want)
						break
					}
				}
			}
		}
	}
	fi, err := os.Lstat(filepath.Join(workspaceOnHost(b, info), "f"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != want {
		t.Errorf("a workspace file is owned by host uid %d, want %d", uid, want)
	}
	if _, err := os.Lstat(filepath.Join(data, "g")); err != nil {
		t.Errorf("the rw host directory was not writable: %v", err)
	}
}

// TestHostDirInTwoModes: one host directory mounted both read-only and
// read-write in a session is writable through the rw mount (an idmapped
// clone: the directory is root's and not writable by others) and stays
// read-only through the ro one, whichever mount is opened first.
func TestHostDirInTwoModes(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	cases := []struct {
		name           string
		hostPath       backends.MountMode // "": no host_path
		extra          []backends.MountMode
		roPath, rwPath string
	}{
		{"host_path ro, extra mount rw", backends.MountRO, []backends.MountMode{backends.MountRW}, "/workspace", "/m0"},
		{"host_path rw, extra mount ro", backends.MountRW, []backends.MountMode{backends.MountRO}, "/m0", "/workspace"},
		{"extra mounts ro then rw", "", []backends.MountMode{backends.MountRO, backends.MountRW}, "/m0", "/m1"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			if err := os.Chmod(data, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(data, "f"), []byte("hi\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			info := newSession(t, b, func(s *backends.SandboxSpec) {
				s.SessionID = "two-modes-" + strconv.Itoa(i)
				if tc.hostPath != "" {
					s.HostPath, s.HostPathMode = data, tc.hostPath
				}
				for n, mode := range tc.extra {
					s.ExtraMounts = append(s.ExtraMounts, backends.MountSpec{HostPath: data, MountPath: "/m" + strconv.Itoa(n), Mode: mode})
				}
			})
			cmd := "cat " + tc.roPath + "/f; touch " + tc.rwPath + "/g && echo wrote; touch " + tc.roPath + "/h 2>/dev/null || echo refused"
			if got := mustRun(t, b, info, cmd); got != "hi\nwrote\nrefused\n" {
				t.Fatalf("%q: %q", cmd, got)
			}
			if _, err := os.Lstat(filepath.Join(data, "g")); err != nil {
				t.Fatalf("the write through the rw mount is not on the host: %v", err)
			}
			if _, err := os.Lstat(filepath.Join(data, "h")); err == nil {
				t.Fatal("a write through the ro mount reached the host")
			}
		})
	}
}

// TestWorkspaceQuota: the workspace, /tmp and /home share the session's
// disk; filling it is ENOSPC to the command, and freeing space makes it
// usable again.
func TestWorkspaceQuota(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.WorkspaceQuotaMB = 32 })
	for _, dir := range []string{"/workspace", "/tmp", "/home"} {
		t.Run(dir, func(t *testing.T) {
			r := execIn(t, b, info, backends.ExecRequest{Cmd: "dd if=/dev/zero of=" + dir + "/big bs=1M count=64"})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.status.ExitCode == 0 || !strings.Contains(r.stderr, "No space left on device") {
				t.Fatalf("64 MiB fit into a 32 MiB quota: status %+v stderr %q", r.status, r.stderr)
			}
			mustRun(t, b, info, "rm "+dir+"/big && echo fits > "+dir+"/small")
		})
	}
}

// TestStopSessionLeavesNothing: deleting a session unmounts its disk and
// frees its loop device, also for a session adopted after a reboot (disk
// not mounted any more until its first exec).
func TestStopSessionLeavesNothing(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	cases := []struct {
		name    string
		unmount bool
	}{
		{"mounted", false},
		{"remounted after a reboot", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := backends.DefaultSandboxSpec()
			spec.SessionID = "leak-" + strconv.FormatBool(tc.unmount)
			info, err := b.StartSession(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			dir, _ := b.sessionDir(info)
			stage := filepath.Join(stageRoot, b.cfg.InstanceID, info.BackendSessionID)
			mustRun(t, b, info, "echo x > /workspace/f")
			if !slices.Contains(mountPoints(t), filepath.Join(stage, fsDir)) {
				t.Fatal("the session's disk is not mounted")
			}
			if tc.unmount {
				if err := b.dropFiles(info.BackendSessionID); err != nil {
					t.Fatal(err)
				}
				if got := mustRun(t, b, info, "cat /workspace/f"); got != "x\n" {
					t.Fatalf("after remount: %q", got)
				}
			}
			if err := b.StopSession(context.Background(), info); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Fatal("session directory left behind")
			}
			if _, err := os.Stat(stage); err == nil {
				t.Fatal("stage directory left behind")
			}
			for _, m := range mountPoints(t) {
				if strings.HasPrefix(m, dir) || strings.HasPrefix(m, stage) {
					t.Fatalf("mount left behind: %s", m)
				}
			}
			assertNoLoopDevice(t, filepath.Join(dir, diskImage))
		})
	}
}

func mountPoints(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 4 {
			out = append(out, unescapeMount(f[4]))
		}
	}
	return out
}

// assertNoLoopDevice fails while a loop device is backed by img (autoclear
// detaches asynchronously, so allow a moment).
func assertNoLoopDevice(t *testing.T, img string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		var held []string
		for _, f := range files {
			if data, err := os.ReadFile(f); err == nil && strings.HasPrefix(strings.TrimSpace(string(data)), img) {
				held = append(held, f)
			}
		}
		if len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop devices still backed by %s: %v", img, held)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSyscallFilter: sandboxed code runs under the seccomp filter —
// io_uring, keyrings, BPF and userfaultfd fail with EPERM or ENOSYS —
// while ordinary programs (sh, python3) work.
func TestSyscallFilter(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	native, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, b, info, "grep Seccomp: /proc/self/status"); got != "Seccomp:\t2\n" {
		t.Fatalf("sandbox runs without a syscall filter: %q", got)
	}
	cases := []struct {
		name string
		args string
	}{
		{"io_uring_setup", "1, 0"},
		{"keyctl", "0, -3, 0"}, // KEYCTL_GET_KEYRING_ID of the session keyring
		{"add_key", "b\"user\", b\"k\", b\"v\", 1, -3"},
		{"bpf", "0, 0, 0"},
		{"userfaultfd", "0"},
		{"perf_event_open", "0, 0, -1, -1, 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nr, ok := native.SyscallNames[tc.name]
			if !ok {
				t.Fatalf("no syscall %s here", tc.name)
			}
			script := "import ctypes\n" +
				"libc = ctypes.CDLL(None, use_errno=True)\n" +
				"r = libc.syscall(" + strconv.Itoa(nr) + ", " + tc.args + ")\n" +
				"print(r, ctypes.get_errno())\n"
			got := strings.Fields(mustRun(t, b, info, "python3 -c '"+script+"'"))
			if len(got) != 2 || got[0] != "-1" || (got[1] != strconv.Itoa(int(unix.EPERM)) && got[1] != strconv.Itoa(int(unix.ENOSYS))) {
				t.Fatalf("%s returned %v (result, errno), want -1 with EPERM or ENOSYS", tc.name, got)
			}
		})
	}
	if got := mustRun(t, b, info, `sh -c 'echo sh' && python3 -c 'import os, subprocess; print(subprocess.run(["echo", "py"], capture_output=True, text=True).stdout.strip())'`); got != "sh\npy\n" {
		t.Fatalf("ordinary commands under the filter: %q", got)
	}
}

// TestNoSetuidFiles: files in an rw host directory belong to host root
// (idmapped), so a setuid bit there would be a setuid-root program on the
// host. No way of setting one may work; ordinary modes still do.
func TestNoSetuidFiles(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	data := t.TempDir()
	info := newSession(t, b, func(s *backends.SandboxSpec) {
		s.ExtraMounts = []backends.MountSpec{{HostPath: data, MountPath: "/data", Mode: backends.MountRW}}
	})
	mustRun(t, b, info, "touch /data/plain && chmod 755 /data/plain")
	attempts := []struct{ name, cmd string }{
		{"chmod u+s", "touch /data/a && chmod 4755 /data/a"},
		{"chmod g+s", "touch /data/b && chmod 2755 /data/b"},
		{"python os.chmod", `python3 -c 'import os; open("/data/c", "w").close(); os.chmod("/data/c", 0o4755)'`},
		{"creating open with the bit", `python3 -c 'import os; os.close(os.open("/data/d", os.O_CREAT | os.O_WRONLY, 0o4755))'`},
		{"fchmod", `python3 -c 'import os; f = os.open("/data/e", os.O_CREAT | os.O_WRONLY, 0o755); os.fchmod(f, 0o6755)'`},
	}
	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			r := execIn(t, b, info, backends.ExecRequest{Cmd: a.cmd})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.status.ExitCode == 0 {
				t.Errorf("%q succeeded", a.cmd)
			}
		})
	}
	entries, err := os.ReadDir(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("host file %s has mode %v", e.Name(), fi.Mode())
		}
	}
	if fi, err := os.Stat(filepath.Join(data, "plain")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("an ordinary chmod did not take: %v %v", fi, err)
	}
}

// TestEscapes runs the escape table every backend and runtime of the test
// matrix faces (backendtest.RunEscapeTests) against bwrap.
func TestEscapes(t *testing.T) {
	backendtest.RunEscapeTests(t, conformanceEnv(t))
}

// TestHostPathRecreated: a host directory deleted and made again between
// two execs is mounted afresh (the old descriptor would make bwrap fail
// with "Can't find source path /proc/self/fd/N"), both as the workspace and
// as an extra mount; one replaced by a symlink is refused with a typed
// error and nothing is written where it points.
func TestHostPathRecreated(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	ws, extra, victim := backendtest.ReachableDir(t), backendtest.ReachableDir(t), backendtest.ReachableDir(t)
	info := newSession(t, b, func(s *backends.SandboxSpec) {
		s.HostPath = ws
		s.ExtraMounts = []backends.MountSpec{{HostPath: extra, MountPath: "/data", Mode: backends.MountRW}}
	})
	mustRun(t, b, info, "echo one > /workspace/one && echo one > /data/one")
	for _, d := range []string{ws, extra} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(d, 0o777); err != nil || os.Chmod(d, 0o777) != nil {
			t.Fatal(err)
		}
	}
	mustRun(t, b, info, "test ! -e /workspace/one && echo two > /workspace/two && echo two > /data/two")
	for _, p := range []string{filepath.Join(ws, "two"), filepath.Join(extra, "two")} {
		if b, err := os.ReadFile(p); err != nil || string(b) != "two\n" {
			t.Errorf("%s on the host after the exec: %q %v", p, b, err)
		}
	}

	if err := os.RemoveAll(extra); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, extra); err != nil {
		t.Fatal(err)
	}
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "echo pwned > /data/pwned"})
	if !errors.Is(r.err, boxerr.ErrValidation) || !strings.Contains(r.err.Error(), "extra_mounts[0].host_path") {
		t.Errorf("exec with the extra mount swapped for a symlink: err %v status %+v, want a BoxValidationError naming extra_mounts[0].host_path", r.err, r.status)
	}
	if _, err := os.Lstat(filepath.Join(victim, "pwned")); err == nil {
		t.Error("the exec wrote through the planted symlink")
	}
}
