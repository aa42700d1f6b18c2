package bwrap

import (
	"context"
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// TestPrestartExec checks that the next plain exec in the mount path runs
// in the sandbox spawned ahead of it, with its command intact, and that
// anything else ends it and still works. Every command fails on purpose:
// a used sandbox's run ends with the command's status, an unused one's
// shell reads EOF and exits 0.
func TestPrestartExec(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	info := newSession(t, b, nil)
	marker := mark("60.0421")
	scenarios := []struct {
		name     string
		req      backends.ExecRequest
		uses     bool
		want     string
		code     int
		timedOut bool
	}{
		{name: "a plain exec runs in it, its command as written",
			req:  backends.ExecRequest{Cmd: "printf '%s|%s\\n' \"it's\" '$HOME'\necho \"$PWD\"\nexit 3"},
			uses: true, want: "it's|$HOME\n/workspace\n", code: 3},
		{name: "the mount path given explicitly is the same",
			req:  backends.ExecRequest{Cmd: "pwd; exit 4", Workdir: "/workspace/"},
			uses: true, want: "/workspace\n", code: 4},
		{name: "an exec with environment spawns its own",
			req:  backends.ExecRequest{Cmd: "echo \"$X\"; exit 5", Env: map[string]string{"X": "from env"}},
			want: "from env\n", code: 5},
		{name: "an exec in another directory spawns its own",
			req:  backends.ExecRequest{Cmd: "pwd; exit 6", Workdir: "/tmp"},
			want: "/tmp\n", code: 6},
		{name: "a command that overruns its timeout in it is killed",
			req:  backends.ExecRequest{Cmd: "sleep " + marker, Timeout: time.Second},
			uses: true, timedOut: true},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			if err := b.PrestartExec(context.Background(), info); err != nil {
				t.Fatalf("PrestartExec: %v", err)
			}
			p := peekPrestarted(t, b, info)
			r := execIn(t, b, info, sc.req)
			if r.err != nil || r.status.TimedOut != sc.timedOut || (!sc.timedOut && r.status.ExitCode != sc.code) || r.stdout != sc.want {
				t.Fatalf("exec: err=%v status=%+v stdout=%q stderr=%q; want exit %d, timed out %v, stdout %q",
					r.err, r.status, r.stdout, r.stderr, sc.code, sc.timedOut, sc.want)
			}
			waitRunDone(t, p.r)
			if _, left := b.prestarts.Take(context.Background(), info.BackendSessionID); left {
				t.Fatal("the prestarted sandbox is still on offer")
			}
			if used := !p.r.state.Success(); used != sc.uses {
				t.Fatalf("prestarted sandbox used: %v, want %v (its status: %v)", used, sc.uses, p.r.state)
			}
			assertNoHostProcs(t, "sleep "+marker)
		})
	}
}

// TestPrestartExecEnds checks that an unused prestarted sandbox ends when
// the backend closes and when its session is stopped, leaving nothing
// running and nothing on offer.
func TestPrestartExecEnds(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	for _, sc := range []struct {
		name string
		end  func(info backends.Session)
	}{
		{"the session is stopped", func(info backends.Session) {
			if err := b.StopSession(context.Background(), info); err != nil {
				t.Fatal(err)
			}
		}},
		// Last: a closed backend's prestarts end whatever is offered later.
		{"the backend closes", func(backends.Session) { b.prestarts.EndAll() }},
	} {
		t.Run(sc.name, func(t *testing.T) {
			info := newSession(t, b, nil)
			if err := b.PrestartExec(context.Background(), info); err != nil {
				t.Fatal(err)
			}
			p := peekPrestarted(t, b, info)
			sc.end(info)
			waitRunDone(t, p.r)
			if _, left := b.prestarts.Take(context.Background(), info.BackendSessionID); left {
				t.Fatal("an ended prestarted sandbox is still on offer")
			}
		})
	}
}

// peekPrestarted returns the session's prestarted sandbox, left on offer.
func peekPrestarted(t *testing.T, b *Backend, info backends.Session) *prestarted {
	t.Helper()
	p, ok := b.prestarts.Take(context.Background(), info.BackendSessionID)
	if !ok {
		t.Fatal("no prestarted sandbox")
	}
	b.prestarts.Put(info.BackendSessionID, p)
	return p
}

func waitRunDone(t *testing.T, r *run) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the prestarted sandbox is still running")
	}
}
