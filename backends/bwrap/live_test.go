package bwrap

import (
	"syscall"
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestExecLive runs the live exec tests every backend shares, and a
// signal to a tree with a child that ignores it: the shell dies, the
// child stays (a signal is only a signal; a kill or a timeout would end
// the tree).
func TestExecLive(t *testing.T) {
	marker := mark("77.")
	env := conformanceEnv(t)
	backendtest.LiveExec(t, env, backendtest.LiveCase{
		Name:  "TERM reaches the tree; the child that ignores it stays",
		Cmd:   "(trap '' TERM; exec sleep " + marker + ") & echo ready; wait",
		Stdin: true,
		Drive: func(t *testing.T, l backendtest.Live) {
			backendtest.WaitFor(t, l.Out, "ready")
			l.Signals <- syscall.SIGTERM
		},
		Check: func(t *testing.T, r backendtest.LiveResult) {
			if r.Err != nil || r.Status.ExitCode != 128+int(syscall.SIGTERM) {
				t.Fatalf("status %+v err %v, want the shell's death by TERM", r.Status, r.Err)
			}
			if got := backendtest.KillMarked(t, env.Backend, r.Session, marker); got != "found\n" {
				t.Fatalf("the child that ignored TERM: finder said %q, want it still running", got)
			}
			assertNoHostProcs(t, marker)
		},
	})
}
