package docker_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/backendtest"
)

// TestExecLive runs the live exec tests every backend shares, and docker's
// own: a signal to a tree with a child that ignores it (that child holds the
// exec's output open until the exec is cancelled, and the sweep at the end
// of a live exec leaves nothing of the tree behind), and a command that
// handles TERM ends with its own status — the wrapper around it must not
// die of the forwarded signal (Podman ends the exec stream as soon as the
// wrapper exits; dockerd 2 s later). A terminal command echoes what is
// typed, ends with its own status and is under the container's seccomp
// profile: on gVisor too, where the agent makes the terminal and relays
// it (an Engine exec there would be outside the profile).
func TestExecLive(t *testing.T) {
	t.Parallel()
	env := conformanceEnv(t)
	backendtest.LiveExec(t, env, dockerLiveCases(env, backendtest.Marker(43))...)
}

// TestExecLiveEngineExecs: the same where the agent cannot serve (a
// remote engine), through Engine execs: a session is a machine there too
// (what a command that ended on its own left running stays), and a
// signalled command's leftovers go with it.
func TestExecLiveEngineExecs(t *testing.T) {
	t.Parallel()
	env := conformanceEnv(t, engineExecs)
	cases := dockerLiveCases(env, backendtest.Marker(46))
	if onGVisor(t) {
		// An Engine exec's terminal on gVisor is outside the seccomp
		// profile (operations.md says so; the agent relays a terminal to
		// keep it inside), so that case is the agent's alone there.
		cases = slices.DeleteFunc(cases, func(c backendtest.LiveCase) bool { return strings.Contains(c.Name, "under seccomp") })
	}
	backendtest.LiveExec(t, env, cases...)
}

// dockerLiveCases are docker's own live exec cases in env; marker names
// the sleep whose end they check.
func dockerLiveCases(env backendtest.Env, marker string) []backendtest.LiveCase {
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
	return []backendtest.LiveCase{{
		Name:   "TERM reaches the tree; the kill takes the child that ignores it",
		Cmd:    "trap 'echo got TERM' TERM; (trap '' TERM; echo ready; exec sleep " + marker + ") & wait; wait",
		Cancel: true,
		Drive: func(t *testing.T, l backendtest.Live) {
			// The child says ready once it ignores TERM: a TERM before
			// that would kill it, and the shell would end on its own.
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
		backendtest.LiveCase{
			Name:  "terminal: typed input echoes, own exit code, under seccomp",
			Cmd:   `grep Seccomp: /proc/self/status; read l; echo "got:$l"; exit 5`,
			TTY:   true,
			Stdin: true,
			Drive: func(t *testing.T, l backendtest.Live) {
				backendtest.WaitFor(t, l.Out, "Seccomp:")
				_, _ = io.WriteString(l.In, "typed\r")
			},
			Check: func(t *testing.T, r backendtest.LiveResult) {
				if r.Err != nil || r.Stdout != "Seccomp:\t2\r\ntyped\r\ngot:typed\r\n" || r.Status.ExitCode != 5 {
					t.Fatalf("want seccomp 2, the echo, got:typed and exit 5, got %+v %q %v", r.Status, r.Stdout, r.Err)
				}
			},
		},
		backendtest.LiveCase{
			Name:    "terminal: a timeout ends it",
			Cmd:     "echo ready; sleep 60",
			TTY:     true,
			Timeout: 2 * time.Second,
			Drive:   func(t *testing.T, l backendtest.Live) { backendtest.WaitFor(t, l.Out, "ready") },
			Check: func(t *testing.T, r backendtest.LiveResult) {
				if r.Err != nil || !r.Status.TimedOut || r.Status.Restarted {
					t.Fatalf("want timed out (the session kept), got %+v %q %v", r.Status, r.Stdout, r.Err)
				}
			},
		},
		handlesTerm("a command that handles TERM ends with its own status", false),
		handlesTerm("a command that handles TERM ends with its own status, with stdin", true),
	}
}

// TestExecTerminalEngineExecs: where the agent cannot serve (here: no
// agent binary; on gVisor also a runsc without --host-uds=open), a
// terminal command runs as an Engine exec, on the engine's terminal.
func TestExecTerminalEngineExecs(t *testing.T) {
	t.Parallel()
	b := newBackend(t, engineExecs)
	info := startSession(t, b)
	r := runCtx(context.Background(), t, b, info, backends.ExecRequest{Cmd: "test -t 0 && stty size; exit 4", Timeout: 30 * time.Second,
		TTY: &backends.TTYSize{Rows: 24, Cols: 80}})
	if r.err != nil || r.stdout != "24 80\r\n" || r.status.ExitCode != 4 {
		t.Fatalf("got %+v %q %v, want 24 80 and exit 4", r.status, r.stdout, r.err)
	}
}

// TestOutputDrainedAfterExit: a command's output outlives it
// (backendtest.OutputDrain).
func TestOutputDrainedAfterExit(t *testing.T) {
	t.Parallel()
	backendtest.OutputDrain(t, conformanceEnv(t))
}
