package bwrap

import (
	"testing"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestExecLive runs the live exec tests every backend shares.
func TestExecLive(t *testing.T) {
	backendtest.LiveExec(t, conformanceEnv(t))
}

// TestOutputDrainedAfterExit: a command's output outlives it
// (backendtest.OutputDrain).
func TestOutputDrainedAfterExit(t *testing.T) {
	t.Parallel()
	backendtest.OutputDrain(t, conformanceEnv(t))
}
