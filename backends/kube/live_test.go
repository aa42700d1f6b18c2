package kube_test

import (
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
	"github.com/boxrt/boxrt/backends/kube"
)

// TestExecLive runs the live exec tests every backend shares, then kube's
// own: a terminal's end of stdin (no half-close on a terminal, so the
// end-of-file character), a signal to a tree with a child that traps it,
// and the timeout of an exec with a stdin (no watcher: the kill goes
// through a helper exec). The sweep at the end of a live exec leaves
// nothing of the tree behind.
func TestExecLive(t *testing.T) {
	env := liveEnv(t)
	trapped, timedOut := backendtest.Marker(44), backendtest.Marker(45)
	backendtest.LiveExec(t, env,
		backendtest.LiveCase{
			Name:  "terminal: the end of stdin is the end-of-file character",
			Cmd:   "cat; echo end",
			TTY:   true,
			Stdin: true,
			Drive: func(t *testing.T, l backendtest.Live) {
				_, _ = io.WriteString(l.In, "typed\r")
				l.In.Close()
			},
			Check: func(t *testing.T, r backendtest.LiveResult) {
				if r.Err != nil || !strings.HasSuffix(r.Stdout, "end\r\n") || strings.Count(r.Stdout, "typed") != 2 {
					t.Fatalf("got %q %v", r.Stdout, r.Err)
				}
			},
		},
		backendtest.LiveCase{
			Name:   "TERM reaches the tree; the kill takes the child that traps it",
			Cmd:    "(trap 'echo trapped' TERM; echo ready; sleep " + trapped + " & wait; sleep " + trapped + " & wait) & wait",
			Cancel: true,
			Drive: func(t *testing.T, l backendtest.Live) {
				backendtest.WaitFor(t, l.Out, "ready")
				l.Signals <- syscall.SIGTERM
				backendtest.WaitFor(t, l.Out, "trapped")
			},
			Check: func(t *testing.T, r backendtest.LiveResult) {
				if r.Err == nil {
					t.Fatalf("a cancelled exec reports its context's error, got %+v", r.Status)
				}
				env.NoProcesses(t, r.Session, trapped)
			},
		},
		backendtest.LiveCase{
			Name:    "timeout of an exec with stdin kills its tree",
			Cmd:     "(trap '' TERM; exec sleep " + timedOut + ") & cat",
			Stdin:   true,
			Timeout: 3 * time.Second,
			Drive:   func(*testing.T, backendtest.Live) {},
			Check: func(t *testing.T, r backendtest.LiveResult) {
				if r.Err != nil || !r.Status.TimedOut {
					t.Fatalf("got %+v %v", r.Status, r.Err)
				}
				env.NoProcesses(t, r.Session, timedOut)
			},
		},
	)
}

// waitNoProcesses polls until no process of the Pod runs a command line
// containing substr.
func waitNoProcesses(t *testing.T, b *kube.Backend, info backends.Session, substr string) {
	t.Helper()
	var left []string
	for i := 0; i < 30; i++ {
		left = left[:0]
		for _, line := range strings.Split(mustRun(t, b, info, backendtest.ListProcesses), "\n") {
			if strings.Contains(line, substr) {
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

// TestOutputDrainedAfterExit: a command's output outlives it
// (backendtest.OutputDrain).
func TestOutputDrainedAfterExit(t *testing.T) {
	backendtest.OutputDrain(t, liveEnv(t))
}

// TestExecLivePerExec: the shared live exec tests where commands run as
// execs of their own (no agent binary, or a new Pod's agent still being
// uploaded): what a command that ended on its own left running stays
// there too.
func TestExecLivePerExec(t *testing.T) {
	env := liveEnv(t, func(c *kube.Config) { c.AgentBinary = "" })
	env.Ready = nil
	backendtest.LiveExec(t, env)
}

// liveEnv is a kube backend as the shared exec tests drive it.
func liveEnv(t *testing.T, mutate ...func(*kube.Config)) backendtest.Env {
	b := newBackend(t, "", mutate...)
	return backendtest.Env{
		Backend: b,
		Spec:    func(name string) backends.SandboxSpec { return spec(name + "-" + randomID()) },
		NoProcesses: func(t *testing.T, info backends.Session, marker string) {
			waitNoProcesses(t, b, info, marker)
		},
		Ready: func(_ *testing.T, info backends.Session) { b.WaitAgent(info.BackendSessionID) },
	}
}
