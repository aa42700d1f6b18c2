package sandboxagent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// The test binary is also the agent: startAgent runs it as
// "agent --connect SOCKET", as boxrt runs itself in a sandbox.
func TestMain(m *testing.M) {
	RunIfAgent()
	goleak.VerifyTestMain(m)
}

var testEnv = []string{"PATH=/usr/bin:/bin"}

type session struct {
	dir   string
	l     *Listener
	c     *Conn
	agent *exec.Cmd
}

// startAgent runs the agent dialing sock; its stderr is logged when the
// test fails.
func startAgent(t *testing.T, sock string) *exec.Cmd {
	t.Helper()
	logFile, err := os.Create(filepath.Join(t.TempDir(), "agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "agent", "--connect", sock)
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile.Name())
			t.Logf("agent's stderr:\n%s", b)
		}
	})
	return cmd
}

// newSession listens in dir, starts an agent and accepts it.
func newSession(t *testing.T, dir string) *session {
	t.Helper()
	l, err := Listen(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	agent := startAgent(t, filepath.Join(dir, SocketName))
	c := accept(t, l)
	if c.AgentPID() != agent.Process.Pid {
		t.Errorf("AgentPID %d, the agent is %d", c.AgentPID(), agent.Process.Pid)
	}
	return &session{dir: dir, l: l, c: c, agent: agent}
}

func accept(t *testing.T, l *Listener) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// spawn starts req on c; the process's group is killed when the test ends
// (without a pid namespace, the sandbox's pids are the host's).
func spawn(t *testing.T, c *Conn, req SpawnRequest) *Proc {
	t.Helper()
	p, err := c.Spawn(context.Background(), req)
	if err != nil {
		t.Fatalf("Spawn %q: %v", req.Argv, err)
	}
	t.Cleanup(func() { unix.Kill(-p.PID(), unix.SIGKILL) })
	return p
}

func wait(t *testing.T, p *Proc) Exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := p.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return e
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

func sh(script string) []string { return []string{"sh", "-c", script} }

func TestSpawnWithPipes(t *testing.T) {
	s := newSession(t, t.TempDir())
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	p := spawn(t, s.c, SpawnRequest{Argv: sh("echo out; echo err >&2; exit 3"), Env: testEnv, Stdout: outW, Stderr: errW})
	outW.Close()
	errW.Close()
	out, _ := io.ReadAll(outR)
	errOut, _ := io.ReadAll(errR)
	if e := wait(t, p); e != (Exit{Code: 3}) {
		t.Errorf("exit %+v, want code 3", e)
	}
	if string(out) != "out\n" || string(errOut) != "err\n" {
		t.Errorf("stdout %q, stderr %q", out, errOut)
	}
}

func TestExitCodes(t *testing.T) {
	s := newSession(t, t.TempDir())
	for script, want := range map[string]Exit{
		"exit 0":        {},
		"exit 1":        {Code: 1},
		"exit 255":      {Code: 255},
		"kill -TERM $$": {Code: 143, Signal: 15},
		"kill -KILL $$": {Code: 137, Signal: 9},
	} {
		if e := wait(t, spawn(t, s.c, SpawnRequest{Argv: sh(script), Env: testEnv})); e != want {
			t.Errorf("%s: exit %+v, want %+v", script, e, want)
		}
	}
}

// TestSignalGroup: a signal goes to the process's group, so what it left
// in the background gets it too.
func TestSignalGroup(t *testing.T) {
	s := newSession(t, t.TempDir())
	p, grandchild := spawnWithBackground(t, s.c, "wait")
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if e := wait(t, p); e.Signal != int(syscall.SIGTERM) {
		t.Errorf("exit %+v, want killed by SIGTERM", e)
	}
	waitGone(t, grandchild)
	if err := p.Signal(0); err == nil {
		t.Error("signal 0 accepted")
	}
}

// TestSignalAfterExit: the group outlives its leader, and so does the
// way to signal it (a command's timeout kills what it left behind).
func TestSignalAfterExit(t *testing.T) {
	s := newSession(t, t.TempDir())
	p, grandchild := spawnWithBackground(t, s.c, "exit 0")
	if e := wait(t, p); e != (Exit{}) {
		t.Fatalf("exit %+v", e)
	}
	if err := unix.Kill(grandchild, 0); err != nil {
		t.Fatalf("the background process is already gone: %v", err)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, grandchild)
}

// spawnWithBackground runs a shell that starts sleep in the background,
// then runs then; it returns the shell and sleep's pid.
func spawnWithBackground(t *testing.T, c *Conn, then string) (*Proc, int) {
	t.Helper()
	outR, outW := pipe(t)
	p := spawn(t, c, SpawnRequest{Argv: sh("sleep 1000 >/dev/null & echo $!; " + then), Env: testEnv, Stdout: outW})
	outW.Close()
	var grandchild int
	if _, err := fmt.Fscan(bufio.NewReader(outR), &grandchild); err != nil {
		t.Fatalf("reading the background pid: %v", err)
	}
	t.Cleanup(func() { unix.Kill(grandchild, unix.SIGKILL) })
	return p, grandchild
}

// waitGone waits for pid to be gone. The agent, a subreaper, reaps it:
// gone means no zombie either.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for unix.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTTY(t *testing.T) {
	s := newSession(t, t.TempDir())
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	script := `test -t 0 && test -t 1 && test -t 2 && echo isatty; exec 3</dev/tty && echo ctty; read line; echo "got:$line"`
	p := spawn(t, s.c, SpawnRequest{Argv: sh(script), Env: testEnv, TTY: true, Stdin: slave})
	slave.Close()
	if out := readUntil(t, master, "ctty"); !strings.Contains(out, "isatty\r\nctty") {
		t.Errorf("output %q, want isatty and ctty", out)
	}
	if _, err := master.Write([]byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, master, "got:hi")
	if e := wait(t, p); e != (Exit{}) {
		t.Errorf("exit %+v", e)
	}
}

// readUntil reads f until its output contains want.
func readUntil(t *testing.T, f *os.File, want string) string {
	t.Helper()
	var out bytes.Buffer
	buf := make([]byte, 1024)
	f.SetReadDeadline(time.Now().Add(10 * time.Second))
	for !strings.Contains(out.String(), want) {
		n, err := f.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			t.Fatalf("reading for %q: %v (got %q)", want, err, out.String())
		}
	}
	return out.String()
}

func TestStdinPipe(t *testing.T) {
	s := newSession(t, t.TempDir())
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	p := spawn(t, s.c, SpawnRequest{Argv: []string{"cat"}, Env: testEnv, Stdin: inR, Stdout: outW})
	inR.Close()
	outW.Close()
	inW.Write([]byte("hello\n"))
	inW.Close()
	out, _ := io.ReadAll(outR)
	if string(out) != "hello\n" {
		t.Errorf("cat said %q", out)
	}
	if e := wait(t, p); e != (Exit{}) {
		t.Errorf("exit %+v", e)
	}
}

// TestEnvAndDir: the child gets exactly Env (nothing of the agent's) and
// Dir.
func TestEnvAndDir(t *testing.T) {
	s := newSession(t, t.TempDir())
	dir := t.TempDir()
	outR, outW := pipe(t)
	env := append([]string{"FOO=bar baz"}, testEnv...)
	p := spawn(t, s.c, SpawnRequest{Argv: sh(`printf '%s|%s|%s' "$FOO" "$(pwd)" "${HOME-unset}"`), Env: env, Dir: dir, Stdout: outW})
	outW.Close()
	out, _ := io.ReadAll(outR)
	wait(t, p)
	if want := "bar baz|" + dir + "|unset"; string(out) != want {
		t.Errorf("got %q, want %q", out, want)
	}
}

func TestSpawnFailures(t *testing.T) {
	s := newSession(t, t.TempDir())
	for _, tc := range []struct {
		req  SpawnRequest
		want string
	}{
		{SpawnRequest{Argv: []string{"no-such-binary-xyz"}, Env: testEnv}, `"no-such-binary-xyz" not found in PATH`},
		{SpawnRequest{Argv: []string{"/no/such/binary"}, Env: testEnv}, "no such file or directory"},
		{SpawnRequest{Argv: []string{"true"}, Env: testEnv, Dir: "/no/such/dir"}, `working directory "/no/such/dir"`},
		{SpawnRequest{Argv: []string{"true"}, Env: testEnv, Dir: "/etc/passwd"}, "not a directory"},
	} {
		_, err := s.c.Spawn(context.Background(), tc.req)
		var se *SpawnError
		if !errors.As(err, &se) || !strings.Contains(se.Reason, tc.want) {
			t.Errorf("%q in %q: got %v, want a SpawnError with %q", tc.req.Argv, tc.req.Dir, err, tc.want)
		}
	}
	// Refused before anything is sent.
	for _, req := range []SpawnRequest{
		{},
		{Argv: []string{"true"}, Dir: "relative"},
		{Argv: []string{"tr\x00ue"}},
		{Argv: []string{"true"}, TTY: true},
		{Argv: []string{"true"}, Env: []string{strings.Repeat("x", maxFrame)}},
	} {
		var se *SpawnError
		if _, err := s.c.Spawn(context.Background(), req); err == nil || errors.As(err, &se) {
			t.Errorf("%q: got %v, want a request error", req.Argv, err)
		}
	}
	if e := wait(t, spawn(t, s.c, SpawnRequest{Argv: []string{"true"}, Env: testEnv})); e != (Exit{}) {
		t.Errorf("after the failures: exit %+v", e)
	}
}

func TestConcurrentSpawns(t *testing.T) {
	s := newSession(t, t.TempDir())
	const n = 50
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := s.c.Spawn(context.Background(), SpawnRequest{Argv: sh(fmt.Sprintf("exit %d", i)), Env: testEnv})
			if err != nil {
				errs <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if e, err := p.Wait(ctx); err != nil || e.Code != i {
				errs <- fmt.Errorf("spawn %d: exit %+v, %v", i, e, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestAgentKilled(t *testing.T) {
	s := newSession(t, t.TempDir())
	p := spawn(t, s.c, SpawnRequest{Argv: []string{"sleep", "1000"}, Env: testEnv})
	s.agent.Process.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Wait(ctx); !errors.Is(err, ErrAgentLost) {
		t.Errorf("Wait: %v, want ErrAgentLost", err)
	}
	select {
	case <-s.c.Done():
	default:
		t.Error("Done is not closed")
	}
	if !errors.Is(s.c.Err(), ErrAgentLost) {
		t.Errorf("Err: %v", s.c.Err())
	}
	if _, err := s.c.Spawn(ctx, SpawnRequest{Argv: []string{"true"}}); !errors.Is(err, ErrAgentLost) {
		t.Errorf("Spawn after: %v", err)
	}
}

// TestReconnect: a boxrt that comes back and listens at the same path
// gets the agent back, whose children kept running.
func TestReconnect(t *testing.T) {
	s := newSession(t, t.TempDir())
	p := spawn(t, s.c, SpawnRequest{Argv: []string{"sleep", "1000"}, Env: testEnv})
	s.c.Close()
	s.l.Close()
	if _, err := p.Wait(context.Background()); !errors.Is(err, ErrAgentLost) {
		t.Errorf("Wait after Close: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(s.dir, SocketName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there after Close: %v", err)
	}
	l, err := Listen(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := accept(t, l)
	if c.AgentPID() != s.agent.Process.Pid {
		t.Errorf("another agent came back: %d, was %d", c.AgentPID(), s.agent.Process.Pid)
	}
	if err := unix.Kill(p.PID(), 0); err != nil {
		t.Errorf("the child did not survive the reconnection: %v", err)
	}
	if e := wait(t, spawn(t, c, SpawnRequest{Argv: sh("exit 7"), Env: testEnv})); e.Code != 7 {
		t.Errorf("after reconnecting: exit %+v", e)
	}
}

// TestLongPath: sun_path holds 108 bytes; neither side uses the full path.
func TestLongPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := newSession(t, dir)
	if e := wait(t, spawn(t, s.c, SpawnRequest{Argv: []string{"true"}, Env: testEnv})); e != (Exit{}) {
		t.Errorf("exit %+v", e)
	}
	st, err := os.Stat(filepath.Join(dir, SocketName))
	if err != nil || st.Mode().Perm() != 0o666 {
		t.Errorf("socket: %v, %v; want mode 0666", st, err)
	}
}

func TestListenStaleSocket(t *testing.T) {
	dir := t.TempDir()
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, SocketName), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	l, err := Listen(dir)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	again, err := Listen(dir)
	if err != nil {
		t.Fatalf("Listen over a live socket of this process: %v", err)
	}
	l.Close() // the older one: leaves again's socket alone
	if _, err := os.Lstat(filepath.Join(dir, SocketName)); err != nil {
		t.Errorf("closing a replaced Listener removed its successor's socket: %v", err)
	}
	again.Close()

	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, SocketName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err := Listen(other); err == nil {
		l.Close()
		t.Error("Listen replaced a regular file")
	}
}

// TestAcceptCancel: Accept returns when its ctx ends, with nobody dialing.
func TestAcceptCancel(t *testing.T) {
	l, err := Listen(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Accept: %v", err)
	}
}

// TestPeerPID: the kernel's word on who connected agrees with the agent's.
func TestPeerPID(t *testing.T) {
	s := newSession(t, t.TempDir())
	if s.c.PeerPID() != s.agent.Process.Pid {
		t.Errorf("PeerPID %d, the agent is %d", s.c.PeerPID(), s.agent.Process.Pid)
	}
}

// TestAgentKeepsNoDescriptor: once a process started, the agent has
// closed the pipe and the pty it was passed, and holds one connection.
func TestAgentKeepsNoDescriptor(t *testing.T) {
	s := newSession(t, t.TempDir())
	_, outW := pipe(t)
	master, slave, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer master.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(outW.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	passed := map[string]bool{fmt.Sprintf("pipe:[%d]", st.Ino): true, slave.Name(): true}
	p1 := spawn(t, s.c, SpawnRequest{Argv: []string{"true"}, Env: testEnv, Stdout: outW})
	p2 := spawn(t, s.c, SpawnRequest{Argv: []string{"true"}, Env: testEnv, TTY: true, Stdin: slave})
	slave.Close()
	wait(t, p1)
	wait(t, p2)
	fdDir := fmt.Sprintf("/proc/%d/fd", s.agent.Process.Pid)
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	sockets := 0
	for _, e := range entries {
		target, _ := os.Readlink(filepath.Join(fdDir, e.Name()))
		switch {
		case strings.HasPrefix(target, "socket:"):
			sockets++
		case passed[target]:
			t.Errorf("the agent still holds descriptor %s: %s", e.Name(), target)
		}
	}
	if sockets != 1 {
		t.Errorf("the agent holds %d sockets, want its one connection", sockets)
	}
}
