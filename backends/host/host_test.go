package host

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
)

func newSession(t *testing.T, hostPath string) (*Backend, backends.Session) {
	t.Helper()
	b, err := New(Config{InstanceID: "inst", StateDir: t.TempDir()})
	require.NoError(t, err)
	require.NoError(t, b.Probe(context.Background()))
	spec := backends.SandboxSpec{SessionID: "ws-0123-g1-" + strings.Repeat("x", 90)}
	spec.Sandbox = backends.DefaultSandboxSpec().Sandbox
	spec.HostPath = hostPath
	s, err := b.StartSession(context.Background(), spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.StopSession(context.Background(), s) })
	return b, s
}

func run(t *testing.T, b *Backend, s backends.Session, req backends.ExecRequest) (backends.ExitStatus, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	req.Stdout, req.Stderr = &out, &errOut
	if req.Workdir == "" {
		req.Workdir = "/workspace"
	}
	st, err := b.Exec(context.Background(), s, req)
	require.NoError(t, err)
	return st, out.String(), errOut.String()
}

func TestMinimalEnvironment(t *testing.T) {
	t.Setenv("LANGBOT_BOX_CONTROL_TOKEN", "secret-token-that-must-not-leak-0123456789")
	t.Setenv("BOXRT_CONTROL_TOKEN", "another-secret-that-must-not-leak-0123456789")
	t.Setenv("LANG", "C.UTF-8")
	b, s := newSession(t, "")
	_, out, _ := run(t, b, s, backends.ExecRequest{Cmd: "env | cut -d= -f1", Env: map[string]string{"MINE": "1"}})
	allowed := map[string]bool{"PATH": true, "LANG": true, "LC_ALL": true, "LC_CTYPE": true, "TERM": true, "HOME": true,
		"TMPDIR": true, "LANGBOT_BOX_WORKSPACE": true, "MINE": true, "PWD": true, "SHLVL": true, "_": true, "OLDPWD": true}
	keys := strings.Fields(out)
	for _, k := range keys {
		assert.True(t, allowed[k], "%s leaked into the command's environment", k)
	}
	assert.Contains(t, keys, "MINE")
	assert.Contains(t, keys, "LANG")
	assert.NotContains(t, out, "TOKEN")
}

func TestExec(t *testing.T) {
	b, s := newSession(t, "")
	ws := filepath.Join(s.BackendSessionID, "workspace")
	tests := []struct {
		name    string
		req     backends.ExecRequest
		code    int
		stdout  string
		timeout bool
	}{
		{name: "output and exit code", req: backends.ExecRequest{Cmd: "echo hi; exit 3"}, code: 3, stdout: "hi\n"},
		{name: "workdir is the workspace", req: backends.ExecRequest{Cmd: "pwd"}, stdout: ws + "\n"},
		{name: "workdir under the mount path", req: backends.ExecRequest{Cmd: "mkdir -p sub && cd sub && pwd", Workdir: "/workspace"}, stdout: ws + "/sub\n"},
		{name: "home in the session", req: backends.ExecRequest{Cmd: `echo "$HOME"`}, stdout: filepath.Join(s.BackendSessionID, "home") + "\n"},
		{name: "timeout", req: backends.ExecRequest{Cmd: "sleep 30", Timeout: 300 * time.Millisecond}, timeout: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, out, _ := run(t, b, s, tc.req)
			assert.Equal(t, tc.timeout, st.TimedOut)
			if !tc.timeout {
				assert.Equal(t, tc.code, st.ExitCode)
				assert.Equal(t, tc.stdout, out)
			}
		})
	}
}

// A timed-out exec takes its whole process group with it, background
// children included.
func TestExecTimeoutKillsTheGroup(t *testing.T) {
	b, s := newSession(t, "")
	pidFile := filepath.Join(s.BackendSessionID, "workspace", "bg.pid")
	st, _, _ := run(t, b, s, backends.ExecRequest{Cmd: "sleep 60 & echo $! > bg.pid; wait", Timeout: 500 * time.Millisecond})
	require.True(t, st.TimedOut)
	raw, err := os.ReadFile(pidFile)
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 5*time.Second, 50*time.Millisecond, "background child %d survived", pid)
}

func TestCancelledExecKillsTheGroup(t *testing.T) {
	b, s := newSession(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	_, err := b.Exec(ctx, s, backends.ExecRequest{Cmd: "sleep 60", Workdir: "/workspace", Stdout: io.Discard, Stderr: io.Discard})
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), 10*time.Second)
}

func TestHostPathWorkspaceAndStop(t *testing.T) {
	hp := t.TempDir()
	b, s := newSession(t, hp)
	_, out, _ := run(t, b, s, backends.ExecRequest{Cmd: "echo data > f && pwd"})
	assert.Equal(t, hp+"\n", out)
	require.NoError(t, b.StopSession(context.Background(), s))
	assert.False(t, b.Alive(context.Background(), s))
	_, err := os.Stat(filepath.Join(hp, "f"))
	assert.NoError(t, err, "a host_path workspace survives the session")
}

func TestManagedProcess(t *testing.T) {
	b, s := newSession(t, "")
	p, err := b.StartProcess(context.Background(), s, backends.ProcessSpec{Command: "sh", Args: []string{"-c", "read l; echo err >&2; echo got $l; exec sleep 60"}, Cwd: "/workspace"})
	require.NoError(t, err)
	_, err = p.Stdin().Write([]byte("ping\n"))
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, err := p.Stdout().Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "got ping\n", string(buf[:n]))
	require.NoError(t, p.Signal(syscall.SIGTERM))
	code, err := p.Wait()
	require.NoError(t, err)
	assert.Equal(t, -int(syscall.SIGTERM), code)
	rest, err := io.ReadAll(p.Stderr())
	require.NoError(t, err)
	assert.Equal(t, "err\n", string(rest), "output buffered at exit stays readable")
}
