package kube_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/kube"
)

// TestExecLive: stdin, a terminal with a resize, and signals to a tree
// with a child that traps TERM, through ExecRequest's live fields, as
// docker's TestExecLive. The sweep at the end of a live exec leaves
// nothing of the tree behind.
func TestExecLive(t *testing.T) {
	b := newBackend(t, "")
	info := start(t, b, spec("live-"+randomID()))
	type drive func(t *testing.T, in *io.PipeWriter, out *syncBuffer, resize chan<- backends.Resize, sig chan<- syscall.Signal)
	noDrive := func(*testing.T, *io.PipeWriter, *syncBuffer, chan<- backends.Resize, chan<- syscall.Signal) {}
	cases := []struct {
		name   string
		cmd    string
		tty    bool
		stdin  bool // give the command a stdin (else: an exec that may only be signalled)
		cancel bool // cancel the exec's context after drive
		drive  drive
		check  func(t *testing.T, r liveResult)
	}{
		{
			name:  "stdin round trip",
			cmd:   "cat; echo end",
			stdin: true,
			drive: func(t *testing.T, in *io.PipeWriter, _ *syncBuffer, _ chan<- backends.Resize, _ chan<- syscall.Signal) {
				_, _ = io.WriteString(in, "hello\n")
				in.Close()
			},
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || r.stdout != "hello\nend\n" || r.status.ExitCode != 0 {
					t.Fatalf("got %q %+v %v", r.stdout, r.status, r.err)
				}
			},
		},
		{
			name:  "terminal and resize",
			cmd:   "test -t 0 && test -t 1 && tty >/dev/null && stty size; read l; stty size",
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
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || !strings.HasPrefix(r.stdout, "30 100\r\n") || !strings.HasSuffix(r.stdout, "40 120\r\n") {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
			},
		},
		{
			name:  "terminal: the end of stdin is the end-of-file character",
			cmd:   "cat; echo end",
			tty:   true,
			stdin: true,
			drive: func(t *testing.T, in *io.PipeWriter, _ *syncBuffer, _ chan<- backends.Resize, _ chan<- syscall.Signal) {
				_, _ = io.WriteString(in, "typed\r")
				in.Close()
			},
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || !strings.HasSuffix(r.stdout, "end\r\n") || strings.Count(r.stdout, "typed") != 2 {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
			},
		},
		{
			name: "TERM reaches the tree; the kill takes the child that traps it",
			cmd:  "(trap 'echo trapped' TERM; sleep 7731 & wait; sleep 7731 & wait) & echo ready; wait",
			drive: func(t *testing.T, _ *io.PipeWriter, out *syncBuffer, _ chan<- backends.Resize, sig chan<- syscall.Signal) {
				waitFor(t, out, "ready")
				sig <- syscall.SIGTERM
				waitFor(t, out, "trapped")
			},
			cancel: true,
			check: func(t *testing.T, r liveResult) {
				if r.err == nil {
					t.Fatalf("a cancelled exec reports its context's error, got %+v", r.status)
				}
				waitNoProcesses(t, b, info, "sleep 7731")
			},
		},
		{
			name:  "with stdin: a child left behind dies with the exec",
			cmd:   "(trap '' TERM HUP; exec sleep 7732 >/dev/null 2>&1) & echo started",
			stdin: true,
			drive: func(t *testing.T, in *io.PipeWriter, _ *syncBuffer, _ chan<- backends.Resize, _ chan<- syscall.Signal) {
				in.Close()
			},
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || r.stdout != "started\n" {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
				waitNoProcesses(t, b, info, "sleep 7732")
			},
		},
		{
			name:  "signalled only: a child left behind dies with the exec",
			cmd:   "(trap '' TERM HUP; exec sleep 7733 >/dev/null 2>&1) & echo started",
			drive: noDrive,
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || r.stdout != "started\n" {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
				waitNoProcesses(t, b, info, "sleep 7733")
			},
		},
		{
			name:  "signalled only: stdin is empty",
			cmd:   "cat; echo end",
			drive: noDrive,
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || r.stdout != "end\n" {
					t.Fatalf("got %q %v", r.stdout, r.err)
				}
			},
		},
		{
			name:  "timeout of an exec with stdin kills its tree",
			cmd:   "(trap '' TERM; exec sleep 7734) & cat",
			stdin: true,
			drive: noDrive,
			check: func(t *testing.T, r liveResult) {
				if r.err != nil || !r.status.TimedOut {
					t.Fatalf("got %+v %v", r.status, r.err)
				}
				waitNoProcesses(t, b, info, "sleep 7734")
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inR, inW := io.Pipe()
			resize, sig := make(chan backends.Resize), make(chan syscall.Signal)
			var out syncBuffer
			req := backends.ExecRequest{Cmd: tc.cmd, Resize: resize, Signals: sig, Stdout: &out, Timeout: 60 * time.Second}
			if strings.HasPrefix(tc.name, "timeout") {
				req.Timeout = 3 * time.Second
			}
			if tc.stdin {
				req.Stdin = inR
			}
			if tc.tty {
				req.TTY = &backends.TTYSize{Rows: 30, Cols: 100}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan liveResult, 1)
			go func() {
				st, err := b.Exec(ctx, info, req)
				done <- liveResult{stdout: out.String(), status: st, err: err}
			}()
			tc.drive(t, inW, &out, resize, sig)
			if tc.cancel {
				cancel()
			}
			select {
			case r := <-done:
				tc.check(t, r)
			case <-time.After(90 * time.Second):
				t.Fatalf("exec did not end; output %q", out.String())
			}
		})
	}
}

type liveResult struct {
	stdout string
	status backends.ExitStatus
	err    error
}

// syncBuffer is a bytes.Buffer safe to read while an exec writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// waitFor waits until out contains s.
func waitFor(t *testing.T, out *syncBuffer, s string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), s); {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", s, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitNoProcesses polls until no process of the Pod runs a command line
// containing substr.
func waitNoProcesses(t *testing.T, b *kube.Backend, info backends.Session, substr string) {
	t.Helper()
	var left []string
	for i := 0; i < 30; i++ {
		left = left[:0]
		for _, line := range strings.Split(mustRun(t, b, info, "ps -o args"), "\n") {
			if strings.Contains(line, substr) && !strings.Contains(line, "ps -o args") {
				left = append(left, strings.TrimSpace(line))
			}
		}
		if len(left) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("processes matching %q still running: %q", substr, left)
}
