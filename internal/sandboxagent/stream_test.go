package sandboxagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// streamAgent runs the test binary as a listening agent in a temporary
// directory and returns its socket.
func streamAgent(t *testing.T) (sock string, agent *exec.Cmd) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	agent = exec.Command(os.Args[0], "agent", "--listen", sock)
	var log bytes.Buffer
	agent.Stderr = &log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Kill()
		agent.Wait()
		if t.Failed() {
			t.Logf("agent's stderr:\n%s", log.String())
		}
	})
	return sock, agent
}

// bridgeTo runs "agent --bridge sock" (what an exec in a Pod runs) and
// speaks to the agent through its stdin and stdout.
func bridgeTo(t *testing.T, sock string) (*Conn, *exec.Cmd) {
	t.Helper()
	br := exec.Command(os.Args[0], "agent", "--bridge", sock)
	stdin, err := br.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := br.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Bridge(ctx, stdout, stdin)
	if err != nil {
		t.Fatalf("Bridge: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		br.Process.Kill()
		br.Wait()
	})
	return c, br
}

func runProc(t *testing.T, c *Conn, req RunRequest) *Proc {
	t.Helper()
	if req.Env == nil {
		req.Env = testEnv
	}
	p, err := c.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run %q: %v", req.Argv, err)
	}
	t.Cleanup(func() { syscall.Kill(-p.PID(), syscall.SIGKILL) })
	return p
}

// syncBuffer is a Buffer the output goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(s.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q never had %q", s.String(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStreamRun(t *testing.T) {
	sock, _ := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	var out, errOut bytes.Buffer
	p := runProc(t, c, RunRequest{Argv: sh("echo out; echo err >&2; cat; exit 3"), Stdin: strings.NewReader("typed\n"), Stdout: &out, Stderr: &errOut})
	if e := wait(t, p); e != (Exit{Code: 3}) {
		t.Errorf("exit %+v, want code 3", e)
	}
	if out.String() != "out\ntyped\n" || errOut.String() != "err\n" {
		t.Errorf("stdout %q, stderr %q", out.String(), errOut.String())
	}
}

// TestStreamLargeOutput: many windows' worth of output and input go
// through, all of it, in order.
func TestStreamLargeOutput(t *testing.T) {
	sock, _ := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	in := bytes.Repeat([]byte("0123456789abcdef"), 3*streamWindow/16+7)
	var out bytes.Buffer
	p := runProc(t, c, RunRequest{Argv: []string{"cat"}, Stdin: bytes.NewReader(in), Stdout: &out})
	if e := wait(t, p); e != (Exit{}) {
		t.Errorf("exit %+v", e)
	}
	if !bytes.Equal(out.Bytes(), in) {
		t.Errorf("cat gave back %d bytes, want the %d sent", out.Len(), len(in))
	}
}

// slowWriter takes its time: the agent must hold the output back (the
// child blocks on a full pipe), not buffer it.
type slowWriter struct {
	n     int
	delay time.Duration
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(w.delay)
	w.n += len(p)
	return len(p), nil
}

func TestStreamSlowReader(t *testing.T) {
	sock, agent := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	w := &slowWriter{delay: 20 * time.Millisecond}
	const total = 64 << 20
	p := runProc(t, c, RunRequest{Argv: sh("head -c 67108864 /dev/zero"), Stdout: w})
	time.Sleep(time.Second)
	// The window and the pipe hold a few hundred KiB; without flow control
	// the agent would have read all 64 MiB by now.
	if rss := rssKiB(t, agent.Process.Pid); rss > 60<<10 {
		t.Errorf("the agent holds %d KiB while the reader is slow", rss)
	}
	p.Signal(syscall.SIGKILL)
	if e := wait(t, p); e.Signal != int(syscall.SIGKILL) {
		t.Errorf("exit %+v, want killed", e)
	}
	if w.n >= total {
		t.Errorf("all output went through a reader that slow: %d", w.n)
	}
}

func rssKiB(t *testing.T, pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				kib, _ := strconv.Atoi(f[0])
				return kib
			}
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func TestStreamTTY(t *testing.T) {
	sock, _ := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	var out syncBuffer
	inR, inW := io.Pipe()
	defer inW.Close()
	script := `test -t 0 && test -t 1 && echo isatty; stty size; read line; stty size; echo "got:$line"`
	p := runProc(t, c, RunRequest{Argv: sh(script), TTY: &TermSize{Rows: 24, Cols: 80}, Stdin: inR, Stdout: &out})
	out.waitFor(t, "24 80")
	if err := p.Resize(context.Background(), TermSize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	inW.Write([]byte("hi\n"))
	out.waitFor(t, "got:hi")
	if e := wait(t, p); e != (Exit{}) {
		t.Errorf("exit %+v", e)
	}
	if s := out.String(); !strings.Contains(s, "isatty") || !strings.Contains(s, "50 132") {
		t.Errorf("output %q, want isatty and the new size", s)
	}
}

// TestStreamBridgeReopened: a broken bridge loses no process; the next
// bridge reaches the same agent, and a process started before answers
// through a file.
func TestStreamBridgeReopened(t *testing.T) {
	sock, agent := streamAgent(t)
	c, br := bridgeTo(t, sock)
	dir := t.TempDir()
	p := runProc(t, c, RunRequest{Argv: sh("sleep 1000 >/dev/null 2>&1 & echo $! > " + dir + "/bg")})
	wait(t, p)
	br.Process.Kill()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the Conn did not see its bridge die")
	}
	c2, _ := bridgeTo(t, sock)
	if c2.AgentPID() != agent.Process.Pid {
		t.Errorf("second bridge reached agent %d, want %d", c2.AgentPID(), agent.Process.Pid)
	}
	var out bytes.Buffer
	p2 := runProc(t, c2, RunRequest{Argv: sh("kill -0 $(cat " + dir + "/bg) && echo alive"), Stdout: &out})
	wait(t, p2)
	if out.String() != "alive\n" {
		t.Errorf("the background process: %q", out.String())
	}
	b, _ := os.ReadFile(dir + "/bg")
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

func TestStreamSignalAndFailures(t *testing.T) {
	sock, _ := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	p := runProc(t, c, RunRequest{Argv: sh("sleep 1000 & wait")})
	p.Signal(syscall.SIGTERM)
	if e := wait(t, p); e.Signal != int(syscall.SIGTERM) {
		t.Errorf("exit %+v, want SIGTERM", e)
	}
	_, err := c.Run(context.Background(), RunRequest{Argv: []string{"no-such-program"}, Env: testEnv})
	var se *SpawnError
	if !errors.As(err, &se) {
		t.Errorf("Run of a missing program: %v, want a SpawnError", err)
	}
	if _, err := c.Run(context.Background(), RunRequest{Argv: []string{"true"}, TTY: &TermSize{}}); err == nil {
		t.Error("a terminal of size 0 was accepted")
	}
	var out bytes.Buffer
	pe := runProc(t, c, RunRequest{Argv: sh(`echo "$PATH|$FOO"`), Env: []string{"FOO=bar"}, InheritEnv: true, Stdout: &out})
	wait(t, pe)
	if want := os.Getenv("PATH") + "|bar\n"; out.String() != want {
		t.Errorf("inherited environment: %q, want %q", out.String(), want)
	}
	if err := p.Resize(context.Background(), TermSize{Rows: 1, Cols: 1}); err == nil {
		t.Error("resize of a process without a terminal was accepted")
	}
}

// TestStreamAgentKilled: the agent's death fails a pending Wait with
// ErrAgentLost.
func TestStreamAgentKilled(t *testing.T) {
	sock, agent := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	p := runProc(t, c, RunRequest{Argv: []string{"sleep", "1000"}})
	agent.Process.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Wait(ctx); !errors.Is(err, ErrAgentLost) {
		t.Errorf("Wait: %v, want ErrAgentLost", err)
	}
}

// TestStreamShortOutputs: the output of a process that ends at once is
// never lost to the drain after its exit.
func TestStreamShortOutputs(t *testing.T) {
	sock, _ := streamAgent(t)
	c, _ := bridgeTo(t, sock)
	for i := 0; i < 300; i++ {
		var out bytes.Buffer
		p := runProc(t, c, RunRequest{Argv: []string{"echo", "kept"}, Stdout: &out})
		if e := wait(t, p); e != (Exit{}) || out.String() != "kept\n" {
			t.Fatalf("run %d: exit %+v, output %q", i, e, out.String())
		}
	}
}

// TestStreamTwoBridges: two bridges (two boxrt replicas serving one
// session) are served at once, each with its own processes.
func TestStreamTwoBridges(t *testing.T) {
	sock, _ := streamAgent(t)
	c1, _ := bridgeTo(t, sock)
	var out1 syncBuffer
	inR, inW := io.Pipe()
	defer inW.Close()
	p1 := runProc(t, c1, RunRequest{Argv: []string{"cat"}, Stdin: inR, Stdout: &out1})
	c2, _ := bridgeTo(t, sock)
	var out2 bytes.Buffer
	wait(t, runProc(t, c2, RunRequest{Argv: []string{"echo", "two"}, Stdout: &out2}))
	if out2.String() != "two\n" {
		t.Errorf("second bridge: %q", out2.String())
	}
	inW.Write([]byte("one\n"))
	out1.waitFor(t, "one\n")
	inW.Close()
	if e := wait(t, p1); e != (Exit{}) {
		t.Errorf("first bridge's process: exit %+v", e)
	}
	select {
	case <-c1.Done():
		t.Errorf("the first bridge was dropped: %v", c1.Err())
	default:
	}
}
