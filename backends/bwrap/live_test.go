package bwrap

import (
	"syscall"
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestExecLive runs the live exec tests every backend shares, and a
// signal to a tree with a child that ignores it: the shell dies, and the
// child goes when it has (a signal is box_exec_kill's: a kill, however
// gentle its first signal).
func TestExecLive(t *testing.T) {
	marker := mark("77.")
	backendtest.LiveExec(t, conformanceEnv(t), backendtest.LiveCase{
		Name:  "TERM reaches the tree; the child that ignores it is killed when the shell has ended",
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
			assertNoHostProcs(t, marker)
		},
	})
}

// TestOutputDrainedAfterExit: a command's output outlives it
// (backendtest.OutputDrain).
func TestOutputDrainedAfterExit(t *testing.T) {
	t.Parallel()
	backendtest.OutputDrain(t, conformanceEnv(t))
}
