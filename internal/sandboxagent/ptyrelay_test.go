package sandboxagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// termSession starts script on a terminal the agent makes (30x100), with
// boxrt's ends of its stdin and output pipes. gone waits until the agent
// holds nothing of the terminal or the pipes.
func termSession(t *testing.T, script string) (p *Proc, stdin, output *os.File, gone func()) {
	t.Helper()
	s := newSession(t, t.TempDir())
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	passed := map[string]bool{pipeName(t, inR): true, pipeName(t, outW): true}
	p = spawn(t, s.c, SpawnRequest{Argv: sh(script), Env: testEnv, Term: &TermSize{Rows: 30, Cols: 100}, Stdin: inR, Stdout: outW})
	inR.Close()
	outW.Close()
	return p, inW, outR, func() { t.Helper(); waitNoTerminal(t, s.agent.Process.Pid, passed) }
}

func pipeName(t *testing.T, f *os.File) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("pipe:[%d]", st.Ino)
}

// TestTermRelay: the command runs on a terminal of the agent's, as its
// controlling terminal, of the spawn's size; typed input echoes; a resize
// is in effect once Resize returns; the output ends after the exit, and
// the agent keeps nothing of the terminal.
func TestTermRelay(t *testing.T) {
	script := `test -t 0 && test -t 1 && test -t 2 && exec 3</dev/tty && echo ctty; stty size; read l; echo "got:$l"; stty size; exit 3`
	p, stdin, output, gone := termSession(t, script)
	if out := readUntil(t, output, "30 100"); !strings.Contains(out, "ctty\r\n30 100") {
		t.Errorf("output %q, want ctty and 30 100", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Resize(ctx, TermSize{Rows: 40, Cols: 120}); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	if _, err := stdin.Write([]byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	out := readUntil(t, output, "40 120")
	if !strings.Contains(out, "typed\r\ngot:typed\r\n40 120") {
		t.Errorf("output %q, want the echo, got:typed and 40 120", out)
	}
	if e := wait(t, p); e.Code != 3 {
		t.Errorf("exit %+v, want code 3", e)
	}
	start := time.Now()
	if rest, err := io.ReadAll(output); err != nil || len(rest) != 0 {
		t.Errorf("after the exit: %q %v, want EOF", rest, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("output ended %v after the exit", d)
	}
	stdin.Close()
	gone()
}

// TestTermRelayEnds: the relay ends when the command exited even while a
// background process holds the terminal (Linux hangs the terminal up when
// its session leader exits; gVisor's master never reads as hung up, and
// the drain after the exit ends it: the docker tests on runsc cover that),
// and when boxrt closes the stdin pipe (the command sees a hangup).
func TestTermRelayEnds(t *testing.T) {
	t.Run("exit with a background holder", func(t *testing.T) {
		p, stdin, output, gone := termSession(t, `sleep 30 & echo bye`)
		defer stdin.Close()
		wait(t, p)
		output.SetReadDeadline(time.Now().Add(5 * time.Second))
		if out, err := io.ReadAll(output); err != nil || !strings.Contains(string(out), "bye") {
			t.Errorf("output %q %v, want bye and EOF", out, err)
		}
		stdin.Close()
		gone()
	})
	t.Run("stdin closed", func(t *testing.T) {
		p, stdin, output, gone := termSession(t, `echo ready; sleep 30`)
		readUntil(t, output, "ready")
		stdin.Close()
		if e := wait(t, p); e.Signal != 1 {
			t.Errorf("exit %+v, want SIGHUP", e)
		}
		output.Close()
		gone()
	})
}

// waitNoTerminal waits until the agent holds no terminal and none of the
// passed pipes.
func waitNoTerminal(t *testing.T, agentPID int, passed map[string]bool) {
	t.Helper()
	fdDir := fmt.Sprintf("/proc/%d/fd", agentPID)
	var held []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		held = nil
		entries, err := os.ReadDir(fdDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			target, _ := os.Readlink(filepath.Join(fdDir, e.Name()))
			if passed[target] || strings.HasPrefix(target, "/dev/pts/") || target == "/dev/ptmx" {
				held = append(held, target)
			}
		}
		if len(held) == 0 {
			return
		}
	}
	t.Errorf("the agent still holds %q", held)
}

// TestTermRequestChecked: a Term request that cannot be served is refused
// before anything is sent.
func TestTermRequestChecked(t *testing.T) {
	s := newSession(t, t.TempDir())
	r, w := pipe(t)
	for _, tc := range []struct {
		name string
		req  SpawnRequest
		want string
	}{
		{"with TTY", SpawnRequest{TTY: true, Term: &TermSize{Rows: 1, Cols: 1}, Stdin: r, Stdout: w}, "TTY"},
		{"no stdout", SpawnRequest{Term: &TermSize{Rows: 1, Cols: 1}, Stdin: r}, "Stdin and Stdout"},
		{"stderr", SpawnRequest{Term: &TermSize{Rows: 1, Cols: 1}, Stdin: r, Stdout: w, Stderr: w}, "Stderr is nil"},
		{"zero rows", SpawnRequest{Term: &TermSize{Cols: 1}, Stdin: r, Stdout: w}, "outside 1..65535"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Argv = []string{"true"}
			if _, err := s.c.Spawn(context.Background(), tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Spawn: %v, want %q", err, tc.want)
			}
		})
	}
	// A spawn the agent refuses after it made the terminal leaves nothing
	// open: the output pipe reads EOF once boxrt closed its write end.
	inR, _ := pipe(t)
	outR, outW := pipe(t)
	passed := map[string]bool{pipeName(t, inR): true, pipeName(t, outW): true}
	_, err := s.c.Spawn(context.Background(), SpawnRequest{Argv: []string{"/nonexistent"}, Term: &TermSize{Rows: 1, Cols: 1}, Stdin: inR, Stdout: outW})
	var refused *SpawnError
	if !errors.As(err, &refused) {
		t.Fatalf("Spawn of /nonexistent: %v, want a SpawnError", err)
	}
	outW.Close()
	outR.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rest, err := io.ReadAll(outR); err != nil || len(rest) > 0 {
		t.Errorf("output of a refused spawn: %q %v, want EOF", rest, err)
	}
	waitNoTerminal(t, s.agent.Process.Pid, passed)

	p := spawn(t, s.c, SpawnRequest{Argv: []string{"true"}, Env: testEnv, Term: &TermSize{Rows: 1, Cols: 1}, Stdin: r, Stdout: w})
	if err := p.Resize(context.Background(), TermSize{Rows: 0, Cols: 80}); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("Resize to 0 rows: %v", err)
	}
	wait(t, p)
	// A resize of a process that exited is answered, not waited for.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Resize(ctx, TermSize{Rows: 2, Cols: 2}); err != nil {
		t.Errorf("Resize after the exit: %v", err)
	}
}

// TestHostileResize: what a fake agent says wrong about a resize is a
// *ProtocolError, and silence is one after the answer timeout.
func TestHostileResize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer string // the fake's frame after it read the resize; "" is silence
		want   string
	}{
		{"silence", "", "no answer to resize 1 within"},
		{"answered twice", `{"op":"resized","id":1}` + "\n" + `{"op":"resized","id":1}`, "resized for id 1, which has no resize waiting"},
		{"other id", `{"op":"resized","id":2}`, "resized for id 2"},
		{"unknown field", `{"op":"resized","id":1,"rows":9}`, `unknown field "rows"`},
		{"wrong type", `{"op":"resized","id":"1"}`, "cannot unmarshal string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := hostileResize(t, tc.answer)
			var pe *ProtocolError
			if !errors.As(err, &pe) || !strings.Contains(pe.Reason, tc.want) {
				t.Errorf("got %v, want a ProtocolError with %q", err, tc.want)
			}
		})
	}
}

// hostileResize runs a fake agent that starts the spawn, reads the
// resize and answers with answer's lines; it returns the host's error
// (from Resize, or the connection's when Resize itself succeeded).
func hostileResize(t *testing.T, answer string) error {
	t.Helper()
	l, err := Listen(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.timeout = time.Second
	fakeDone := make(chan error, 1)
	go func() {
		fakeDone <- runFake(filepath.Join(l.dir.Name(), SocketName), func(f fake) error {
			if err := f.hello(); err != nil {
				return err
			}
			if err := f.answer(`{"op":"started","id":%d,"pid":1234}`); err != nil {
				return err
			}
			if got, err := f.readJSON(); err != nil || got != `{"op":"resize","id":1,"rows":40,"cols":120}` {
				return fmt.Errorf("want the resize, got %s %v", got, err)
			}
			for _, line := range strings.Split(answer, "\n") {
				if line != "" {
					if err := f.send(line); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, w := pipe(t)
	p, err := c.Spawn(ctx, SpawnRequest{Argv: []string{"true"}, Term: &TermSize{Rows: 30, Cols: 100}, Stdin: r, Stdout: w})
	if err != nil {
		t.Fatal(err)
	}
	if err = p.Resize(ctx, TermSize{Rows: 40, Cols: 120}); err == nil {
		select {
		case <-c.Done():
			err = c.Err()
		case <-time.After(5 * time.Second):
			t.Fatal("the host kept the connection")
		}
	}
	c.Close()
	if ferr := <-fakeDone; ferr != nil {
		t.Errorf("fake agent: %v", ferr)
	}
	return err
}
