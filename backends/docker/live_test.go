package docker_test

import (
	"syscall"
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestExecLive runs the live exec tests every backend shares, and docker's
// own: a signal to a tree with a child that ignores it (that child holds the
// exec's output open until the exec is cancelled, and the sweep at the end
// of a live exec leaves nothing of the tree behind), and a command that
// handles TERM ends with its own status — the wrapper around it must not
// die of the forwarded signal (Podman ends the exec stream as soon as the
// wrapper exits; dockerd 2 s later).
func TestExecLive(t *testing.T) {
	t.Parallel()
	marker := backendtest.Marker(43)
	env := conformanceEnv(t)
	handlesTerm := func(name string, stdin bool) backendtest.LiveCase {
		return backendtest.LiveCase{
			Name:  name,
			Cmd:   "trap 'echo bye; exit 3' TERM; echo ready; sleep 30 & wait",
			Stdin: stdin,
			Drive: func(t *testing.T, l backendtest.Live) {
				backendtest.WaitFor(t, l.Out, "ready")
				l.Signals <- syscall.SIGTERM
			},
			Check: func(t *testing.T, r backendtest.LiveResult) {
				if r.Err != nil || r.Stdout != "ready\nbye\n" || r.Status.ExitCode != 3 {
					t.Fatalf("want the command's own exit 3 after TERM, got %+v %q %v", r.Status, r.Stdout, r.Err)
				}
			},
		}
	}
	backendtest.LiveExec(t, env, backendtest.LiveCase{
		Name:   "TERM reaches the tree; the kill takes the child that ignores it",
		Cmd:    "trap 'echo got TERM' TERM; (trap '' TERM; exec sleep " + marker + ") & echo ready; wait; wait",
		Cancel: true,
		Drive: func(t *testing.T, l backendtest.Live) {
			backendtest.WaitFor(t, l.Out, "ready")
			l.Signals <- syscall.SIGTERM
			// The command outlives the TERM, so the exec really runs when
			// it is cancelled, on every engine.
			backendtest.WaitFor(t, l.Out, "got TERM")
		},
		Check: func(t *testing.T, r backendtest.LiveResult) {
			if r.Err == nil {
				t.Fatalf("a cancelled exec reports its context's error, got %+v", r.Status)
			}
			env.NoProcesses(t, r.Session, marker)
		},
	},
		handlesTerm("a command that handles TERM ends with its own status", false),
		handlesTerm("a command that handles TERM ends with its own status, with stdin", true),
	)
}
