package bwrap

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
// with a child that ignores it, through ExecRequest's live fields.
func TestExecLive(t *testing.T) {
	requireBwrap(t)
	b := newBackend(t)
	info := newSession(t, b, nil)
	marker := mark("77.")
	cases := []struct {
		name  string
		cmd   string
		tty   bool
		drive func(t *testing.T, in *io.PipeWriter, out *syncBuffer, resize chan<- backends.Resize, sig chan<- syscall.Signal)
		check func(t *testing.T, r execResult)
	}{
		{
			name: "stdin round trip",
			cmd:  "cat; echo end",
			drive: func(t *testing.T, in *io.PipeWriter, _ *syncBuffer, _ chan<- backends.Resize, _ chan<- syscall.Signal) {
				_, _ = io.WriteString(in, "hello\n")
				in.Close()
			},
			check: func(t *testing.T, r execResult) {
				if r.stdout != "hello\nend\n" || r.status.ExitCode != 0 {
					t.Fatalf("got %q %+v", r.stdout, r.status)
				}
			},
		},
		{
			name: "terminal and resize",
			cmd:  "test -t 0 && test -t 1 && stty size; read l; stty size",
			tty:  true,
			drive: func(t *testing.T, in *io.PipeWriter, out *syncBuffer, resize chan<- backends.Resize, _ chan<- syscall.Signal) {
				waitFor(t, out, "30 100")
				done := make(chan error, 1)
				resize <- backends.Resize{Size: backends.TTYSize{Rows: 40, Cols: 120}, Done: done}
				if err := <-done; err != nil {
					t.Errorf("resize: %v", err)
				}
				_, _ = io.WriteString(in, "\r")
			},
			check: func(t *testing.T, r execResult) {
				if !strings.HasPrefix(r.stdout, "30 100\r\n") || !strings.HasSuffix(r.stdout, "40 120\r\n") {
					t.Fatalf("got %q", r.stdout)
				}
			},
		},
		{
			name: "TERM reaches the tree and the namespace takes the child that ignores it",
			cmd:  "(trap '' TERM; exec sleep " + marker + ") & echo ready; wait",
			drive: func(t *testing.T, _ *io.PipeWriter, out *syncBuffer, _ chan<- backends.Resize, sig chan<- syscall.Signal) {
				waitFor(t, out, "ready")
				sig <- syscall.SIGTERM
			},
			check: func(t *testing.T, r execResult) {
				if r.status.ExitCode != 128+int(syscall.SIGTERM) {
					t.Fatalf("status %+v, want the shell's death by TERM", r.status)
				}
				assertNoHostProcs(t, marker)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inR, inW := io.Pipe()
			resize, sig := make(chan backends.Resize), make(chan syscall.Signal)
			out := newBuf()
			req := backends.ExecRequest{Cmd: tc.cmd, Stdin: inR, Resize: resize, Signals: sig, Stdout: out, Timeout: 30 * time.Second}
			if tc.tty {
				req.TTY = &backends.TTYSize{Rows: 30, Cols: 100}
			}
			done := make(chan execResult, 1)
			go func() {
				st, err := b.Exec(context.Background(), info, req)
				done <- execResult{stdout: out.String(), status: st, err: err}
			}()
			tc.drive(t, inW, out, resize, sig)
			r := <-done
			if r.err != nil {
				t.Fatalf("exec: %v", r.err)
			}
			tc.check(t, r)
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
