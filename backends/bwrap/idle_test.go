package bwrap

import (
	"testing"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// released reports whether the session's sandbox is stopped.
func released(b *Backend, info backends.Session) bool {
	res := &b.files(info.BackendSessionID).res
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.conn == nil
}

// TestIdleSandboxReleased: a sandbox with nothing of the session's running
// is stopped after IdleRelease and started again by the next call, which
// does not say restarted; the files are kept. One with a background
// process is kept, with its process, as is a warm pool's.
func TestIdleSandboxReleased(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	b := newBackend(t)
	b.cfg.IdleRelease = 300 * time.Millisecond
	info := newSession(t, b, nil)
	busy := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = t.Name() + "-busy" })
	pooled := newSession(t, b, func(s *backends.SandboxSpec) { s.SessionID = backends.PoolSessionPrefix + "idle-test" })
	mustRun(t, b, info, "echo kept > /workspace/f")
	mustRun(t, b, busy, "sleep 300.5151 >/dev/null 2>&1 &")
	deadline := time.Now().Add(10 * time.Second)
	for !released(b, info) {
		if time.Now().After(deadline) {
			t.Fatal("the idle sandbox was not released")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if released(b, busy) {
		t.Fatal("the sandbox with a background process was released")
	}
	if released(b, pooled) {
		t.Fatal("a warm pool's sandbox was released")
	}
	r := execIn(t, b, info, backends.ExecRequest{Cmd: "cat /workspace/f"})
	if r.err != nil || r.status.ExitCode != 0 || r.stdout != "kept\n" || r.status.Restarted {
		t.Fatalf("the call after the release: %+v, want the file and no restart", r)
	}
	time.Sleep(time.Second)
	r = execIn(t, b, busy, backends.ExecRequest{Cmd: "grep -l '300[.]5151' /proc/[0-9]*/cmdline >/dev/null && echo running"})
	if r.stdout != "running\n" || r.status.Restarted {
		t.Fatalf("the busy session: %+v, want its process running", r)
	}
}

// TestIdleReleaseDetachesEgress: a network: on session's egress session
// goes with its released sandbox and comes back with the next one.
func TestIdleReleaseDetachesEgress(t *testing.T) {
	t.Parallel()
	requireRoot(t)
	b := newBackend(t)
	b.cfg.IdleRelease = 300 * time.Millisecond
	info := newSession(t, b, func(s *backends.SandboxSpec) { s.Network = backends.NetworkOn })
	const route = "awk '$2 == \"00000000\" {print $1}' /proc/net/route"
	if got := mustRun(t, b, info, route); got != "lo\n" {
		t.Fatalf("default route before the release: %q", got)
	}
	sf := b.files(info.BackendSessionID)
	deadline := time.Now().Add(10 * time.Second)
	for !released(b, info) {
		if time.Now().After(deadline) {
			t.Fatal("the idle sandbox was not released")
		}
		time.Sleep(50 * time.Millisecond)
	}
	sf.mu.Lock()
	net := sf.net
	sf.mu.Unlock()
	if net != nil || b.cfg.Egress.Session(info.SessionID) != nil {
		t.Fatal("the egress proxy still serves the released sandbox")
	}
	if got := mustRun(t, b, info, route); got != "lo\n" {
		t.Fatalf("default route after the release: %q", got)
	}
	if b.cfg.Egress.Session(info.SessionID) == nil {
		t.Fatal("the next sandbox is not attached to the egress proxy")
	}
}
