package docker_test

import (
	"bufio"
	"context"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/docker"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// startProcess starts a managed process and drains its stderr (as the
// runtime does) into the returned channel, which yields it once at EOF.
func startProcess(t *testing.T, b *docker.Backend, info backends.Session, spec backends.ProcessSpec) (backends.Process, <-chan string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := b.StartProcess(ctx, info, spec)
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	stderr := make(chan string, 1)
	go func() {
		data, _ := io.ReadAll(p.Stderr())
		stderr <- string(data)
	}()
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGKILL)
		_, _ = io.Copy(io.Discard, p.Stdout())
		waitProcess(t, p)
	})
	return p, stderr
}

func waitProcess(t *testing.T, p backends.Process) (int, error) {
	t.Helper()
	type res struct {
		code int
		err  error
	}
	ch := make(chan res, 1)
	go func() { c, err := p.Wait(); ch <- res{c, err} }()
	select {
	case r := <-ch:
		return r.code, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not return within 30s")
		return 0, nil
	}
}

func TestProcessStdio(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	p, stderr := startProcess(t, b, info, backends.ProcessSpec{ProcessID: "cat", Command: "cat"})

	out := bufio.NewReader(p.Stdout())
	for _, line := range []string{"hello\n", `{"jsonrpc":"2.0","id":1}` + "\n"} {
		if _, err := io.WriteString(p.Stdin(), line); err != nil {
			t.Fatal(err)
		}
		got, err := out.ReadString('\n')
		if err != nil || got != line {
			t.Fatalf("read %q, %v; want %q", got, err, line)
		}
	}
	if err := p.Stdin().Close(); err != nil {
		t.Fatalf("closing stdin: %v", err)
	}
	if rest, err := io.ReadAll(out); err != nil || len(rest) != 0 {
		t.Errorf("after EOF: %q, %v", rest, err)
	}
	code, err := waitProcess(t, p)
	if err != nil || code != 0 {
		t.Fatalf("Wait = %d, %v; want 0", code, err)
	}
	if s := <-stderr; s != "" {
		t.Errorf("stderr %q", s)
	}
	if _, err := p.Stdin().Write([]byte("late\n")); err == nil {
		t.Error("write after exit succeeded")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("Signal after exit: %v", err)
	}
	waitNoPidFiles(t, b, info, ".boxrt-proc-")
}

func TestProcessCwdEnvArgsAndExitCode(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	p, stderr := startProcess(t, b, info, backends.ProcessSpec{
		ProcessID: "p",
		Command:   "sh",
		Args:      []string{"-c", `pwd; echo "$FOO"; printf '%s|' "$@"; echo err >&2; exit 7`, "arg0", "a b", "$HOME"},
		Env:       map[string]string{"FOO": "bar baz"},
		Cwd:       "/workspace/srv",
	})
	data, err := io.ReadAll(p.Stdout())
	if err != nil {
		t.Fatal(err)
	}
	if want := "/workspace/srv\nbar baz\na b|$HOME|"; string(data) != want {
		t.Errorf("stdout %q, want %q", data, want)
	}
	if s := <-stderr; s != "err\n" {
		t.Errorf("stderr %q", s)
	}
	if code, err := waitProcess(t, p); err != nil || code != 7 {
		t.Errorf("Wait = %d, %v; want 7", code, err)
	}
}

func TestProcessSignalKillsTree(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	tests := []struct {
		name     string
		args     []string
		sig      syscall.Signal
		wantCode int
		marker   string
	}{
		{"SIGTERM tree", []string{"-c", "sleep 101 & sleep 102"}, syscall.SIGTERM, -int(syscall.SIGTERM), "sleep 10"},
		{"SIGKILL ignoring TERM", []string{"-c", `trap "" TERM; sleep 103 & sleep 104; wait`}, syscall.SIGKILL, -int(syscall.SIGKILL), "sleep 10"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := startProcess(t, b, info, backends.ProcessSpec{ProcessID: "tree", Command: "sh", Args: tc.args})
			// Wait until both sleeps run before signalling.
			for i := 0; len(processesMatching(t, b, info, tc.marker)) < 2; i++ {
				if i > 50 {
					t.Fatal("process tree did not start")
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err := p.Signal(tc.sig); err != nil {
				t.Fatalf("Signal: %v", err)
			}
			_, _ = io.Copy(io.Discard, p.Stdout())
			code, err := waitProcess(t, p)
			if err != nil || code != tc.wantCode {
				t.Errorf("Wait = %d, %v; want %d", code, err, tc.wantCode)
			}
			waitNoProcesses(t, b, info, tc.marker)
		})
	}
}

func TestProcessLeftoversDieWithIt(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	p, _ := startProcess(t, b, info, backends.ProcessSpec{
		ProcessID: "daemonizer", Command: "sh", Args: []string{"-c", "sleep 105 >/dev/null 2>&1 & echo forked"},
	})
	if data, _ := io.ReadAll(p.Stdout()); string(data) != "forked\n" {
		t.Errorf("stdout %q", data)
	}
	if code, err := waitProcess(t, p); err != nil || code != 0 {
		t.Errorf("Wait = %d, %v", code, err)
	}
	waitNoProcesses(t, b, info, "sleep 105")
}

func TestProcessErrors(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	ctx := context.Background()
	if _, err := b.StartProcess(ctx, info, backends.ProcessSpec{ProcessID: "x"}); !isKind(err, boxerr.ErrValidation) {
		t.Errorf("empty command: %v", err)
	}
	p, _ := startProcess(t, b, info, backends.ProcessSpec{ProcessID: "x", Command: "/nonexistent/binary"})
	_, _ = io.Copy(io.Discard, p.Stdout())
	if code, err := waitProcess(t, p); err != nil || code != 127 {
		t.Errorf("missing binary: Wait = %d, %v; want 127", code, err)
	}
	gone := info
	gone.BackendSessionID = "boxrt-does-not-exist-00000000"
	if _, err := b.StartProcess(ctx, gone, backends.ProcessSpec{ProcessID: "x", Command: "cat"}); !isKind(err, boxerr.ErrSessionNotFound) {
		t.Errorf("unknown container: %v, want BoxSessionNotFoundError", err)
	}
}
