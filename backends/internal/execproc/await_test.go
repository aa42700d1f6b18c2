package execproc

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// fakeExec is a Running whose command ends when ended is closed; Kill ends
// it too, as a backend's kill does once the tree is gone.
type fakeExec struct {
	ended   chan struct{}
	killed  bool
	resized []backends.TTYSize
	signals []syscall.Signal
}

func newFakeExec() *fakeExec { return &fakeExec{ended: make(chan struct{})} }

func (f *fakeExec) running() Running {
	return Running{
		Ended:  f.ended,
		Resize: func(s backends.TTYSize) error { f.resized = append(f.resized, s); return nil },
		Signal: func(sig syscall.Signal) { f.signals = append(f.signals, sig) },
		Kill: func() {
			f.killed = true
			close(f.ended)
		},
	}
}

func TestAwaitEnded(t *testing.T) {
	f := newFakeExec()
	close(f.ended)
	_, ended, err := Await(context.Background(), backends.ExecRequest{Timeout: time.Hour}, f.running())
	if !ended || err != nil || f.killed {
		t.Fatalf("ended=%v err=%v killed=%v, want ended, no error, not killed", ended, err, f.killed)
	}
}

func TestAwaitTimeoutKills(t *testing.T) {
	f := newFakeExec()
	status, ended, err := Await(context.Background(), backends.ExecRequest{Timeout: 10 * time.Millisecond}, f.running())
	if ended || err != nil || !status.TimedOut || !f.killed {
		t.Fatalf("status=%+v ended=%v err=%v killed=%v, want a killed, timed-out exec", status, ended, err, f.killed)
	}
}

func TestAwaitCancelKills(t *testing.T) {
	f := newFakeExec()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	status, ended, err := Await(ctx, backends.ExecRequest{}, f.running())
	if ended || !errors.Is(err, context.Canceled) || !status.TimedOut || !f.killed {
		t.Fatalf("status=%+v ended=%v err=%v killed=%v, want a killed exec and ctx's error", status, ended, err, f.killed)
	}
}

func TestAwaitServesResizeAndSignals(t *testing.T) {
	f := newFakeExec()
	resize := make(chan backends.Resize)
	signals := make(chan syscall.Signal)
	req := backends.ExecRequest{Resize: resize, Signals: signals}
	result := make(chan bool)
	go func() {
		_, ended, _ := Await(context.Background(), req, f.running())
		result <- ended
	}()
	done := make(chan error, 1)
	resize <- backends.Resize{Size: backends.TTYSize{Rows: 40, Cols: 100}, Done: done}
	if err := <-done; err != nil {
		t.Fatalf("resize: %v", err)
	}
	signals <- syscall.SIGTERM
	close(f.ended)
	if !<-result {
		t.Fatal("Await did not report the end")
	}
	// The TERM, then, once the command has ended, the KILL that takes what
	// its tree kept (a signal comes from box_exec_kill).
	if len(f.resized) != 1 || f.resized[0].Rows != 40 || len(f.signals) != 2 || f.signals[0] != syscall.SIGTERM || f.signals[1] != syscall.SIGKILL {
		t.Fatalf("resized %v, signalled %v", f.resized, f.signals)
	}
}

func TestAwaitUnsignalledLeavesTheTree(t *testing.T) {
	f := newFakeExec()
	close(f.ended)
	if _, ended, _ := Await(context.Background(), backends.ExecRequest{}, f.running()); !ended || len(f.signals) != 0 || f.killed {
		t.Fatalf("ended %v, signalled %v, killed %v: a command that ends on its own leaves what it started", ended, f.signals, f.killed)
	}
}

func TestAwaitSandboxDied(t *testing.T) {
	f := newFakeExec()
	r := f.running()
	died := make(chan struct{})
	close(died)
	r.SandboxDied = died
	r.SandboxDiedResult = func() (backends.ExitStatus, error) { return backends.ExitStatus{ExitCode: 137}, nil }
	status, ended, err := Await(context.Background(), backends.ExecRequest{}, r)
	if ended || err != nil || status.ExitCode != 137 || f.killed {
		t.Fatalf("status=%+v ended=%v err=%v killed=%v, want the sandbox's result and no kill", status, ended, err, f.killed)
	}
}
