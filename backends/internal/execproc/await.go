package execproc

import (
	"context"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// Running is a box_exec command a backend has started through its exec
// API, as Await drives it: what differs between the backends is behind
// these fields.
type Running struct {
	// Ended is closed once the command's output stream has ended.
	Ended <-chan struct{}
	// Resize sizes the command's terminal.
	Resize func(backends.TTYSize) error
	// Signal delivers sig to the command's process tree. A failure is not
	// the exec's: the command may be ending, leaving nobody to signal.
	Signal func(sig syscall.Signal)
	// Kill kills the command's process tree and returns once its output
	// stream has ended or can no longer be waited for.
	Kill func()
	// SandboxDied, when not nil, is closed when the sandbox died under the
	// command in a way that may leave its stream open for ever;
	// SandboxDiedResult is then the exec's result.
	SandboxDied       <-chan struct{}
	SandboxDiedResult func() (backends.ExitStatus, error)
}

// Await waits for the command to end by itself, for req.Timeout, for
// ctx's cancellation or for the sandbox's death, serving req's resizes and
// signals meanwhile (a command that was signalled has its tree killed
// when it ends: what a command leaves running otherwise stays). ended reports the first: the backend then reads the
// command's outcome. Otherwise status and err are the exec's result: a
// command still running at the timeout or the cancellation is killed and
// reads as timed out (with ctx's error when cancelled); one whose sandbox
// died reads as SandboxDiedResult says. A command that ended at the same
// instant as its timeout or cancellation counts as ended.
func Await(ctx context.Context, req backends.ExecRequest, r Running) (status backends.ExitStatus, ended bool, err error) {
	var expired <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		expired = t.C
	}
	var cancelled error
	signalled := false
	for waiting := true; waiting; {
		select {
		case <-r.Ended:
			if signalled {
				// Signals come from box_exec_kill: a gentler signal is
				// still a kill, so what the tree kept (a child that
				// ignored it) goes when the command has ended.
				r.Signal(syscall.SIGKILL)
			}
			return backends.ExitStatus{}, true, nil
		case <-expired:
			waiting = false
		case <-ctx.Done():
			cancelled = ctx.Err()
			waiting = false
		case rs := <-req.Resize:
			rs.Done <- r.Resize(rs.Size)
		case sig := <-req.Signals:
			signalled = true
			r.Signal(sig)
		case <-r.SandboxDied:
			status, err := r.SandboxDiedResult()
			return status, false, err
		}
	}
	select {
	case <-r.Ended:
		return backends.ExitStatus{}, true, nil
	default:
	}
	r.Kill()
	return backends.ExitStatus{TimedOut: true}, false, cancelled
}
