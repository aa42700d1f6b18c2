package backendtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// LiveCase is one scenario of an exec driven while it runs, through
// ExecRequest's live fields (Stdin, TTY, Resize, Signals).
type LiveCase struct {
	Name string
	Cmd  string
	// TTY runs the command on a 30x100 terminal.
	TTY bool
	// Stdin gives the command a stdin (else: an exec that may only be
	// signalled).
	Stdin bool
	// Cancel cancels the exec's context once Drive returns.
	Cancel bool
	// Timeout, when set, replaces the exec's 60s timeout.
	Timeout time.Duration
	Drive   func(t *testing.T, l Live)
	Check   func(t *testing.T, r LiveResult)
}

// Live is the running exec as a LiveCase's Drive reaches it.
type Live struct {
	// In is the command's stdin (when the case asked for one).
	In *io.PipeWriter
	// Out is its output so far.
	Out     fmt.Stringer
	Resize  chan<- backends.Resize
	Signals chan<- syscall.Signal
}

// LiveResult is how a live exec ended.
type LiveResult struct {
	Session backends.Session
	Stdout  string
	Status  backends.ExitStatus
	Err     error
}

// LiveExec runs the live exec scenarios every backend must pass (stdin,
// a terminal with a resize, what an exec without stdin reads, that what
// an exec leaves running stays, as after a plain exec: a session is a
// machine, and that a signalled exec's leftovers go), then the backend's own
// cases, each in one session of env. env.NoProcesses is how the backend
// looks for processes left behind.
func LiveExec(t *testing.T, env Env, own ...LiveCase) {
	t.Helper()
	info := Start(t, env.Backend, env.Spec("live"))
	if env.Ready != nil {
		env.Ready(t, info)
	}
	for _, tc := range append(liveCases(env), own...) {
		t.Run(tc.Name, func(t *testing.T) { runLive(t, env.Backend, info, tc) })
	}
}

// liveCases are the live exec scenarios every backend must pass.
func liveCases(env Env) []LiveCase {
	left := func(n int) (string, func(t *testing.T, r LiveResult)) {
		marker := Marker(n)
		// "started" only once the child runs as the marked sleep: a check
		// that it is still there must not pass on another process.
		return "(trap '' TERM HUP; exec sleep " + marker + " >/dev/null 2>&1) & for i in $(seq 50); do " +
				"tr '\\0' ' ' </proc/$!/cmdline | grep -q " + marker + " && { echo started; break; }; sleep 0.1; done",
			func(t *testing.T, r LiveResult) {
				if r.Err != nil || r.Stdout != "started\n" {
					t.Fatalf("got %q %v", r.Stdout, r.Err)
				}
				time.Sleep(200 * time.Millisecond)
				if got := KillMarked(t, env.Backend, r.Session, marker); got != "found\n" {
					t.Fatalf("the child the exec left running is gone (the finder said %q): a session keeps what its commands start", got)
				}
				env.NoProcesses(t, r.Session, marker)
			}
	}
	withStdinCmd, withStdinCheck := left(41)
	signalledCmd, signalledCheck := left(42)
	return []LiveCase{
		signalledSweep(env, "TERM reaches the tree; the child that ignores it is killed when the shell has ended", false),
		signalledSweep(env, "TERM reaches the tree; the child that ignores it is killed when the shell has ended, with stdin", true),
		{
			Name:  "stdin round trip",
			Cmd:   "cat; echo end",
			Stdin: true,
			Drive: func(t *testing.T, l Live) {
				_, _ = io.WriteString(l.In, "hello\n")
				l.In.Close()
			},
			Check: func(t *testing.T, r LiveResult) {
				if r.Err != nil || r.Stdout != "hello\nend\n" || r.Status.ExitCode != 0 {
					t.Fatalf("got %q %+v %v", r.Stdout, r.Status, r.Err)
				}
			},
		},
		{
			Name:  "terminal and resize",
			Cmd:   "test -t 0 && test -t 1 && stty size; read l; stty size",
			TTY:   true,
			Stdin: true,
			Drive: func(t *testing.T, l Live) {
				WaitFor(t, l.Out, "30 100")
				done := make(chan error, 1)
				l.Resize <- backends.Resize{Size: backends.TTYSize{Rows: 40, Cols: 120}, Done: done}
				if err := <-done; err != nil {
					t.Errorf("resize: %v", err)
				}
				_, _ = io.WriteString(l.In, "\r")
			},
			Check: func(t *testing.T, r LiveResult) {
				if r.Err != nil || !strings.HasPrefix(r.Stdout, "30 100\r\n") || !strings.HasSuffix(r.Stdout, "40 120\r\n") {
					t.Fatalf("got %q %v", r.Stdout, r.Err)
				}
			},
		},
		{
			Name:  "with stdin: a child left running stays after the exec",
			Cmd:   withStdinCmd,
			Stdin: true,
			Drive: func(t *testing.T, l Live) { l.In.Close() },
			Check: withStdinCheck,
		},
		{
			Name:  "signalled only: a child left running stays after the exec",
			Cmd:   signalledCmd,
			Drive: func(*testing.T, Live) {},
			Check: signalledCheck,
		},
		{
			Name:  "signalled only: stdin is empty",
			Cmd:   "cat; echo end",
			Drive: func(*testing.T, Live) {},
			Check: func(t *testing.T, r LiveResult) {
				if r.Err != nil || r.Stdout != "end\n" {
					t.Fatalf("got %q %v", r.Stdout, r.Err)
				}
			},
		},
	}
}

// signalledSweep is a live exec signalled with TERM whose child ignores
// it. A signal is box_exec_kill's: a kill, however gentle its first
// signal, so what the tree kept goes when the shell has ended. The child
// does not hold the exec's output, so the exec ends with the shell. The
// child says ready once it ignores TERM, so the signal finds it ignoring.
func signalledSweep(env Env, name string, stdin bool) LiveCase {
	ignored := Marker(49)
	return LiveCase{
		Name:  name,
		Cmd:   "(trap '' TERM; echo ready; exec sleep " + ignored + " >/dev/null 2>&1) & wait",
		Stdin: stdin,
		Drive: func(t *testing.T, l Live) {
			WaitFor(t, l.Out, "ready")
			l.Signals <- syscall.SIGTERM
		},
		Check: func(t *testing.T, r LiveResult) {
			if r.Err != nil || r.Status.ExitCode != 128+int(syscall.SIGTERM) {
				t.Fatalf("status %+v err %v, want the shell's death by TERM", r.Status, r.Err)
			}
			env.NoProcesses(t, r.Session, ignored)
		},
	}
}

// runLive runs tc's command in info's session, drives it and checks how it
// ended.
func runLive(t *testing.T, b backends.Backend, info backends.Session, tc LiveCase) {
	inR, inW := io.Pipe()
	resize, sig := make(chan backends.Resize), make(chan syscall.Signal)
	var out SyncBuffer
	req := backends.ExecRequest{Cmd: tc.Cmd, Resize: resize, Signals: sig, Stdout: &out, Timeout: 60 * time.Second}
	if tc.Timeout > 0 {
		req.Timeout = tc.Timeout
	}
	if tc.Stdin {
		req.Stdin = inR
	}
	if tc.TTY {
		req.TTY = &backends.TTYSize{Rows: 30, Cols: 100}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan LiveResult, 1)
	go func() {
		st, err := b.Exec(ctx, info, req)
		done <- LiveResult{Session: info, Stdout: out.String(), Status: st, Err: err}
	}()
	tc.Drive(t, Live{In: inW, Out: &out, Resize: resize, Signals: sig})
	if tc.Cancel {
		cancel()
	}
	tc.Check(t, <-done)
}

// KillMarked runs a plain exec in info's session that SIGKILLs every
// process whose command line holds marker and prints "found" per process.
// The marker is split in the script, so the finder never matches itself.
func KillMarked(t *testing.T, b backends.Backend, info backends.Session, marker string) string {
	t.Helper()
	half := len(marker) / 2
	script := "a=" + marker[:half] + "; b=" + marker[half:] + "; for p in /proc/[0-9]*; do " +
		"case $(tr '\\0' ' ' <$p/cmdline 2>/dev/null) in *\"sleep $a$b\"*) echo found; kill -9 ${p#/proc/} ;; esac; done"
	var out SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.Exec(ctx, info, backends.ExecRequest{Cmd: script, Stdout: &out, Timeout: 20 * time.Second}); err != nil {
		t.Fatalf("finding the marked process: %v", err)
	}
	return out.String()
}

// WaitFor waits until out contains s.
func WaitFor(t *testing.T, out fmt.Stringer, s string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), s); {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %q", s, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Marker is a number unique to this test binary run, to put in a process's
// command line (sleep Marker(n)) and look for it later: n followed by the
// pid zero-padded to a fixed width, so concurrent runs on one machine never
// mistake each other's processes and no marker is a prefix of another.
func Marker(n int) string { return fmt.Sprintf("%d%07d", n, os.Getpid()) }
