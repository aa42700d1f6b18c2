package docker_test

import (
	"context"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// TestExecLive: stdin, a terminal with a resize, and a signal to a tree
// with a child that ignores it, through ExecRequest's live fields. The
// sweep at the end of a live exec leaves nothing of the tree behind.
func TestExecLive(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := startSession(t, b)
	cases := []struct {
		name   string
		cmd    string
		tty    bool
		stdin  bool // give the command a stdin (else: an exec that may only be signalled)
		cancel bool // cancel the exec's context after drive
		drive  func(t *testing.T, in *io.PipeWriter, out *syncBuffer, resize chan<- backends.Resize, sig chan<- syscall.Signal)
		check  func(t *testing.T, r result)
	}{
		{
			name:  "stdin round trip",
			cmd:   "cat; echo end",
			stdin: true,
			drive: func(t *testing.T, in *io.PipeWriter, _ *syncBuffer, _ chan<- backends.Resize, _ chan<- syscall.Signal) {
				_, _ = io.WriteString(in, "hello\n")
				in.Close()
			},
			check: func(t *testing.T, r result) {
				if r.err != nil || r.stdout != "hello\nend\n" || r.status.ExitCode != 0 {
					t.Fatalf("got %q %+v %v", r.stdout, r.status, r.err)
				}
			},
		},
		{
			name:  "terminal and resize",
			cmd:   "test -t 0 && test -t 1 && stty size; read l; stty size",
			tty:   true,
			stdin: true,
			drive: func(t *testing.T, in *io.PipeWriter, out *syncBuffer, resize chan<- backends.Resize, _ chan<- syscall.Signal) {
				waitFor(t, out, "30 100")
				done := make(chan error, 1)
				resize <- backends.Resize{Size: backends.TTYSize{Rows: 40, Cols: 120}, Done: done}
				if err := <-done; err != nil {
					t.Errorf("resize: %v", err)
				}
				_, _ = io.WriteString(in, "\r")
			},
			check: func(t *testing.T, r result) {
				if r.err != nil || !strings.HasPrefix(r.stdout, "30 100\r\n") || !strings.HasSuffix(r.stdout, "40 120\r\n") {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
			},
		},
		{
			// The command outlives the TERM (it traps it, then waits for
			// the TERM-proof child), so the exec is still running at the
			// cancel on every engine.
			name:   "TERM reaches the tree; the kill takes the child that ignores it",
			cmd:    "trap 'echo got TERM' TERM; (trap '' TERM; exec sleep 7731) & echo ready; wait; wait",
			cancel: true,
			drive: func(t *testing.T, _ *io.PipeWriter, out *syncBuffer, _ chan<- backends.Resize, sig chan<- syscall.Signal) {
				waitFor(t, out, "ready")
				sig <- syscall.SIGTERM
				waitFor(t, out, "got TERM")
			},
			check: func(t *testing.T, r result) {
				if r.err == nil {
					t.Fatalf("a cancelled exec reports its context's error, got %+v", r.status)
				}
				waitNoProcesses(t, b, info, "sleep 7731")
			},
		},
		{
			name: "a command that handles TERM ends with its own status",
			cmd:  "trap 'echo bye; exit 3' TERM; echo ready; sleep 30 & wait",
			drive: func(t *testing.T, _ *io.PipeWriter, out *syncBuffer, _ chan<- backends.Resize, sig chan<- syscall.Signal) {
				waitFor(t, out, "ready")
				sig <- syscall.SIGTERM
			},
			check: func(t *testing.T, r result) {
				if r.err != nil || r.stdout != "ready\nbye\n" || r.status.ExitCode != 3 {
					t.Fatalf("got %q %+v %v", r.stdout, r.status, r.err)
				}
			},
		},
		{
			name:  "with stdin: a command that handles TERM ends with its own status",
			cmd:   "trap 'echo bye; exit 3' TERM; echo ready; sleep 30 & wait",
			stdin: true,
			drive: func(t *testing.T, _ *io.PipeWriter, out *syncBuffer, _ chan<- backends.Resize, sig chan<- syscall.Signal) {
				waitFor(t, out, "ready")
				sig <- syscall.SIGTERM
			},
			check: func(t *testing.T, r result) {
				if r.err != nil || r.stdout != "ready\nbye\n" || r.status.ExitCode != 3 {
					t.Fatalf("got %q %+v %v", r.stdout, r.status, r.err)
				}
			},
		},
		{
			name:  "with stdin: a child left behind dies with the exec",
			cmd:   "(trap '' TERM HUP; exec sleep 7732 >/dev/null 2>&1) & echo started",
			stdin: true,
			drive: func(t *testing.T, in *io.PipeWriter, _ *syncBuffer, _ chan<- backends.Resize, _ chan<- syscall.Signal) {
				in.Close()
			},
			check: func(t *testing.T, r result) {
				if r.err != nil || r.stdout != "started\n" {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
				waitNoProcesses(t, b, info, "sleep 7732")
			},
		},
		{
			name:  "signalled only: a child left behind dies with the exec",
			cmd:   "(trap '' TERM HUP; exec sleep 7733 >/dev/null 2>&1) & echo started",
			drive: func(*testing.T, *io.PipeWriter, *syncBuffer, chan<- backends.Resize, chan<- syscall.Signal) {},
			check: func(t *testing.T, r result) {
				if r.err != nil || r.stdout != "started\n" {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
				waitNoProcesses(t, b, info, "sleep 7733")
			},
		},
		{
			name:  "signalled only: stdin is empty",
			cmd:   "cat; echo end",
			drive: func(*testing.T, *io.PipeWriter, *syncBuffer, chan<- backends.Resize, chan<- syscall.Signal) {},
			check: func(t *testing.T, r result) {
				if r.err != nil || r.stdout != "end\n" {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inR, inW := io.Pipe()
			resize, sig := make(chan backends.Resize), make(chan syscall.Signal)
			var out syncBuffer
			req := backends.ExecRequest{Cmd: tc.cmd, Resize: resize, Signals: sig, Stdout: &out, Timeout: 60 * time.Second}
			if tc.stdin {
				req.Stdin = inR
			}
			if tc.tty {
				req.TTY = &backends.TTYSize{Rows: 30, Cols: 100}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan result, 1)
			go func() {
				st, err := b.Exec(ctx, info, req)
				done <- result{stdout: out.String(), status: st, err: err}
			}()
			tc.drive(t, inW, &out, resize, sig)
			if tc.cancel {
				cancel()
			}
			tc.check(t, <-done)
		})
	}
}

// waitFor waits until out contains s.
func waitFor(t *testing.T, out *syncBuffer, s string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), s); {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", s, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
