package docker_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestExecLive runs the live exec tests every backend shares, and a
// signal to a tree with a child that ignores it: on docker that child
// holds the exec's output open until the exec is cancelled, and the sweep
// at the end of a live exec leaves nothing of the tree behind.
func TestExecLive(t *testing.T) {
	t.Parallel()
	marker := backendtest.Marker(43)
	env := conformanceEnv(t)
	backendtest.LiveExec(t, env, backendtest.LiveCase{
		Name:   "TERM reaches the tree; the kill takes the child that ignores it",
		Cmd:    "(trap '' TERM; exec sleep " + marker + ") & echo ready; wait",
		Cancel: true,
		Drive: func(t *testing.T, l backendtest.Live) {
			backendtest.WaitFor(t, l.Out, "ready")
			l.Signals <- syscall.SIGTERM
			time.Sleep(500 * time.Millisecond) // the TERM-proof child holds the output open
		},
		Check: func(t *testing.T, r backendtest.LiveResult) {
			if r.Err == nil {
				t.Fatalf("a cancelled exec reports its context's error, got %+v", r.Status)
			}
			env.NoProcesses(t, r.Session, marker)
		},
	})
}
