package docker_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// TestExecOnStoppedContainer: through Engine execs, an exec whose
// container is stopped, or stops under it, is a typed "session gone"
// error (which the runtime answers by recreating the session), never a
// completed result carrying the engine's error text or the kill signal of
// the container's end. Through the agent, whose death (kill 1) stops the
// container, the container is started again with its files: an exec on a
// stopped one runs and says restarted; one whose agent died under it is a
// typed error and the next exec says restarted.
func TestExecOnStoppedContainer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		before func(t *testing.T, name string)
		cmd    string
	}{
		{
			name: "stopped before the exec",
			before: func(t *testing.T, name string) {
				timeout := 1
				if err := rawClient(t).ContainerStop(context.Background(), name, container.StopOptions{Timeout: &timeout}); err != nil {
					t.Fatal(err)
				}
			},
			cmd: "echo hi",
		},
		{
			name: "stops during the exec",
			cmd:  "kill 1; sleep 10; echo survived",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t)
			info := startSession(t, b)
			mustRun(t, b, info, "echo kept > /workspace/f")
			if tc.before != nil {
				tc.before(t, info.BackendSessionID)
			}
			r := run(t, b, info, tc.cmd, 30*time.Second)
			if !usesAgent(t) {
				if !isKind(r.err, boxerr.ErrSessionNotFound) {
					t.Fatalf("exec: status %+v err %v stdout %q stderr %q; want BoxSessionNotFoundError", r.status, r.err, r.stdout, r.stderr)
				}
				return
			}
			if tc.before == nil {
				if !isKind(r.err, boxerr.ErrBox) || strings.Contains(r.stdout, "survived") {
					t.Fatalf("exec: status %+v err %v stdout %q; want a BoxError saying the agent was lost", r.status, r.err, r.stdout)
				}
				r = run(t, b, info, "echo hi", 30*time.Second)
			}
			if r.err != nil || r.stdout != "hi\n" || !r.status.Restarted {
				t.Fatalf("exec: status %+v err %v stdout %q stderr %q; want hi, restarted", r.status, r.err, r.stdout, r.stderr)
			}
			if got := mustRun(t, b, info, "cat /workspace/f"); got != "kept\n" {
				t.Fatalf("after the restart: %q", got)
			}
			if !b.Alive(context.Background(), info) {
				t.Fatal("session not alive after the restart")
			}
		})
	}
}

// TestHostPathSwappedForSymlink: a host path checked when the session was
// made, then replaced by a symlink out of the allowed roots (what another
// session with a rw mount of the parent can do), is refused when the engine
// would bind it again: at a restart of a re-adopted persistent session, and
// between the check and the start of a new one. Nothing is mounted.
func TestHostPathSwappedForSymlink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := rawClient(t)
	// outside plays /etc: a directory outside every allowed root.
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	swap := func(t *testing.T, path string) {
		t.Helper()
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, path); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name  string
		field string
		set   func(s *backends.SandboxSpec, path string)
	}{
		{"host_path", "host_path", func(s *backends.SandboxSpec, p string) { s.HostPath = p }},
		{"extra mount", "extra_mounts[0].host_path", func(s *backends.SandboxSpec, p string) {
			s.ExtraMounts = []backends.MountSpec{{HostPath: p, MountPath: "/data", Mode: backends.MountRO}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name+" re-adopted", func(t *testing.T) {
			t.Parallel()
			sub := filepath.Join(t.TempDir(), "sub")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			b := newBackend(t)
			info := startSession(t, b, func(s *backends.SandboxSpec) { s.Persistent = true; tc.set(s, sub) })
			if err := cli.ContainerKill(ctx, info.BackendSessionID, "KILL"); err != nil {
				t.Fatal(err)
			}
			waitState(t, info.BackendSessionID, "exited")
			swap(t, sub)

			restarted, err := docker.New(testConfig(t, instanceOf(t, info)))
			if err != nil {
				t.Fatal(err)
			}
			defer restarted.Close()
			adopted, err := restarted.Adopt(ctx)
			if !isKind(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Adopt err = %v, want a BoxValidationError naming %s", err, tc.field)
			}
			if len(adopted) != 0 {
				t.Errorf("adopted %+v", adopted)
			}
			c, err := cli.ContainerInspect(ctx, info.BackendSessionID)
			if err != nil {
				t.Fatal(err)
			}
			if c.State.Running {
				t.Error("the container was restarted with a swapped host path")
			}
		})
		t.Run(tc.name+" new session", func(t *testing.T) {
			t.Parallel()
			sub := filepath.Join(t.TempDir(), "sub")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			swap(t, sub) // checked by the runtime as a directory, swapped since
			id := instanceID()
			b := newBackend(t, func(c *docker.Config) { c.InstanceID = id })
			spec := testSpec(t)
			tc.set(&spec, sub)
			_, err := b.StartSession(ctx, spec)
			if !isKind(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("StartSession err = %v, want a BoxValidationError naming %s", err, tc.field)
			}
			list, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
				filters.Arg("label", docker.LabelInstance+"="+id))})
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 0 {
				t.Errorf("containers left behind: %d", len(list))
			}
		})
	}
}

// TestWorkspaceQuota: a session's own workspace is bounded. Filling it is
// ENOSPC to the command, not a full host disk; the disk image holds at most
// the quota; deleting the session removes the image and frees its loop
// device.
func TestWorkspaceQuota(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		defaultQuota int
		specQuota    int
	}{
		{"spec quota", 0, 16},
		{"configured default", 16, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			b := newBackend(t, func(c *docker.Config) {
				c.StateDir = state
				c.DefaultWorkspaceQuotaMB = tc.defaultQuota
				c.TmpSizeMB = 16
			})
			spec := testSpec(t)
			spec.WorkspaceQuotaMB = tc.specQuota
			info, err := b.StartSession(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			r := run(t, b, info, "dd if=/dev/zero of=/workspace/fill bs=1M count=64 2>&1; echo rc=$?; ls -A /workspace", 60*time.Second)
			if r.err != nil || !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "rc=0") {
				t.Errorf("filling the workspace: err %v stdout %q", r.err, r.stdout)
			}
			images, _ := filepath.Glob(filepath.Join(state, "docker", "*", info.BackendSessionID, "disk.ext4"))
			if len(images) != 1 {
				t.Fatalf("disk images: %v", images)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(images[0], &st); err != nil {
				t.Fatal(err)
			}
			if used := st.Blocks * 512; used > 17<<20 {
				t.Errorf("the disk image takes %d bytes of host disk, more than the 16 MB quota", used)
			}
			if got := mustRun(t, b, info, "echo still usable > /tmp/x && cat /tmp/x"); got != "still usable\n" {
				t.Errorf("session after a full workspace: %q", got)
			}
			// /tmp is a disk of tmp_size_mb of its own.
			r = run(t, b, info, "dd if=/dev/zero of=/tmp/fill bs=1M count=32 2>&1; echo rc=$?; rm -f /tmp/fill", 60*time.Second)
			if r.err != nil || !strings.Contains(r.stdout, "No space left on device") || strings.Contains(r.stdout, "rc=0") {
				t.Errorf("filling /tmp: err %v stdout %q", r.err, r.stdout)
			}
			// Deleting files gives the host its disk back: the image is
			// mounted with discard, which punches holes into it. The kernel
			// may do so after the commit: a generous bound, not a timing.
			mustRun(t, b, info, "rm /workspace/fill && sync")
			var used int64
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if err := syscall.Stat(images[0], &st); err != nil {
					t.Fatal(err)
				}
				if used = st.Blocks * 512; used < 8<<20 {
					break
				}
			}
			if used >= 8<<20 {
				t.Errorf("the disk image still takes %d bytes of host disk after its files were deleted", used)
			}
			if err := b.StopSession(context.Background(), info); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Dir(images[0])); !os.IsNotExist(err) {
				t.Errorf("session directory left after delete: %v", err)
			}
			// Podman answers the removal before the container's mount
			// namespace is gone; the kernel frees the loop device with
			// that last user, a moment later.
			var loops []string
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				tmpImage := filepath.Join(filepath.Dir(images[0]), "tmp.ext4")
				if loops = append(docker.LoopDevicesOf(images[0]), docker.LoopDevicesOf(tmpImage)...); len(loops) == 0 {
					break
				}
			}
			if len(loops) > 0 {
				t.Errorf("loop devices left: %v", loops)
			}
		})
	}
	t.Run("too small", func(t *testing.T) {
		t.Parallel()
		state := t.TempDir()
		b := newBackend(t, func(c *docker.Config) { c.StateDir = state })
		spec := testSpec(t)
		spec.WorkspaceQuotaMB = 1
		if _, err := b.StartSession(context.Background(), spec); !isKind(err, boxerr.ErrValidation) {
			t.Fatalf("quota 1 MB: %v, want BoxValidationError", err)
		}
		if left, _ := filepath.Glob(filepath.Join(state, "docker", "*", "*")); len(left) > 0 {
			t.Errorf("left behind: %v", left)
		}
	})
}

// TestProcessSecretsHiddenFromExecs: with docker.process_user a managed
// process runs as its own user, so an exec (the agent's code) cannot read
// its environment from /proc/<pid>/environ; stopping it still works, and it
// still reads the workspace. Without it (the default) they share a user and
// the secret is readable: the test shows both.
func TestProcessSecretsHiddenFromExecs(t *testing.T) {
	t.Parallel()
	const secret = "sk-boxrt-test-secret-0123456789"
	tests := []struct {
		name        string
		processUser string
		visible     bool
	}{
		{"shared user", "", true},
		{"process user", "2000:1000", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBackend(t, func(c *docker.Config) { c.ProcessUser = tc.processUser })
			info := startSession(t, b)
			mustRun(t, b, info, "echo shared > /workspace/in.txt")
			p, _ := startProcess(t, b, info, backends.ProcessSpec{Command: "sh",
				Args: []string{"-c", "cat /workspace/in.txt; exec sleep 300"}, Env: map[string]string{"MCP_TOKEN": secret}})
			line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
			if err != nil || line != "shared\n" {
				t.Fatalf("the process reads the workspace: %q %v", line, err)
			}
			out := mustRun(t, b, info, "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c MCP_TOKEN= || true")
			// gVisor (runsc 20221219) lets any user read another's
			// /proc/<pid>/environ: process_user does not hide it there
			// (Describe says so).
			want := tc.visible || onGVisor(t)
			if got := strings.TrimSpace(out) != "0"; got != want {
				t.Errorf("secret visible to an exec: %v, want %v (grep count %q)", got, want, out)
			}
			if err := p.Signal(syscall.SIGKILL); err != nil {
				t.Fatalf("Signal: %v", err)
			}
			_, _ = io.Copy(io.Discard, p.Stdout())
			if code, _ := waitProcess(t, p); code != -9 {
				t.Errorf("exit code %d after SIGKILL", code)
			}
		})
	}
}

// TestCPUsAboveHost: a cpus value the engine would refuse (more than its
// host has) is a BoxValidationError naming cpus, with nothing left behind.
func TestCPUsAboveHost(t *testing.T) {
	t.Parallel()
	info, err := rawClient(t).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	id := instanceID()
	b := newBackend(t, func(c *docker.Config) { c.InstanceID = id; c.CPULimitEnabled = true })
	spec := testSpec(t)
	spec.CPUs = float64(info.NCPU) + 1
	_, err = b.StartSession(context.Background(), spec)
	var be *boxerr.Error
	if !errors.As(err, &be) || !isKind(err, boxerr.ErrValidation) || be.Details["field"] != "cpus" {
		t.Fatalf("cpus %v on a %d-CPU engine: %v, want BoxValidationError for cpus", spec.CPUs, info.NCPU, err)
	}
	list, err := rawClient(t).ContainerList(context.Background(), container.ListOptions{All: true,
		Filters: filters.NewArgs(filters.Arg("label", docker.LabelInstance+"="+id))})
	if err != nil || len(list) != 0 {
		t.Errorf("containers left: %d %v", len(list), err)
	}
}

// TestEscapes runs the escape table every backend and runtime of the test
// matrix faces (backendtest.RunEscapeTests) against this matrix entry.
func TestEscapes(t *testing.T) {
	backendtest.RunEscapeTests(t, conformanceEnv(t))
}

// TestNoSetuidInHostPath: a session running as root (docker.user "0:0")
// cannot leave a setuid or setgid file in its host directory, where it
// would be a setuid-root program on the host: chmod and a creating open
// with those bits are refused (EPERM) inside, and a file API write over
// an existing setuid file keeps its mode without them, as on bwrap. The
// same holds for a terminal command: on gVisor it runs on the agent's
// terminal, under the seccomp profile (an Engine exec there is not).
func TestNoSetuidInHostPath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tty  *backends.TTYSize
	}{
		{"plain", nil},
		{"terminal", &backends.TTYSize{Rows: 24, Cols: 80}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			noSetuidInHostPath(t, tc.tty)
		})
	}
}

func noSetuidInHostPath(t *testing.T, tty *backends.TTYSize) {
	ctx := context.Background()
	dir := t.TempDir()
	old := filepath.Join(dir, "old")
	if err := os.WriteFile(old, []byte("old\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(old, 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	b := newBackend(t, func(c *docker.Config) { c.User = "0:0" })
	info := startSession(t, b, func(s *backends.SandboxSpec) { s.HostPath = dir })
	r := runCtx(ctx, t, b, info, backends.ExecRequest{Timeout: 30 * time.Second, TTY: tty,
		Cmd: "cd /workspace && id -u && touch f g && chmod 4755 f; chmod 2755 g; stat -c '%n %a' f g"})
	r.stdout = strings.ReplaceAll(r.stdout, "\r\n", "\n")
	t.Logf("status %+v err %v\nstdout: %s\nstderr: %s", r.status, r.err, r.stdout, r.stderr)
	if r.err != nil || !strings.HasPrefix(r.stdout, "0\n") {
		t.Fatalf("the probe did not run as root: %+v %v %q", r.status, r.err, r.stdout)
	}
	if _, err := b.WriteFile(ctx, info, "/workspace/old", strings.NewReader("new\n"), backends.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 3 {
		t.Fatalf("the probe made no files in the host directory: %v", entries)
	}
	for _, e := range entries {
		fi, err := os.Lstat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("host file %s has mode %v", e.Name(), fi.Mode())
		}
	}
	if fi, err := os.Stat(old); err != nil || fi.Mode() != 0o755 {
		t.Errorf("old after a file API write: %v %v, want -rwxr-xr-x", fi.Mode(), err)
	}
}

// TestFileNameTooLong: a name over NAME_MAX (255 bytes) through the file
// API is the caller's mistake, a BoxValidationError naming the field.
func TestFileNameTooLong(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBackend(t)
	info := startSession(t, b)
	long := "/workspace/" + strings.Repeat("n", 256)
	_, err := b.WriteFile(ctx, info, long, strings.NewReader("x"), backends.WriteOptions{})
	if !isKind(err, boxerr.ErrValidation) || !strings.Contains(err.Error(), "too long") {
		t.Errorf("WriteFile of a 256-byte name: %v, want a BoxValidationError saying the name is too long", err)
	}
	if err := b.MakeDir(ctx, info, long); !isKind(err, boxerr.ErrValidation) {
		t.Errorf("MakeDir of a 256-byte name: %v, want a BoxValidationError", err)
	}
}
