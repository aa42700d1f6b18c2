package runtime

import (
	"context"

	"github.com/boxrt/boxrt/runtime/snapshots"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Every id a caller names is resolved here, within the namespace its
// context carries (runtime/tenant), before any table is looked up: a
// session id maps to the physical id the session table keys; an exec,
// snapshot or process is found only when it belongs to a session of the
// caller's namespace, and otherwise answers exactly as an unknown id does,
// so nothing tells another tenant it exists.

// resolve is the session id the caller of ctx names, as the session
// table keys it.
func resolve(ctx context.Context, id string) (string, error) {
	return tenant.Resolve(ctx, "session_id", id)
}

// liveExecIn finds exec id among the execs of ctx's namespace.
func (e *Execs) liveExecIn(ctx context.Context, id string) (*liveExec, error) {
	x, err := e.table.get(id, e.r.clock.Now())
	if err != nil {
		return nil, err
	}
	if !tenant.Visible(ctx, x.sessionID) {
		return nil, e.table.errNoExec(id)
	}
	return x, nil
}

// snapshotIn finds snapshot id among the snapshots of ctx's Workspace
// (snapshots outlive their session and its placement generation).
func snapshotIn(ctx context.Context, store snapshots.Store, id string) (snapshots.Manifest, error) {
	m, err := store.Get(ctx, id)
	if err != nil {
		return snapshots.Manifest{}, err
	}
	if !tenant.VisibleWorkspace(ctx, m.SessionID) {
		return snapshots.Manifest{}, snapshots.ErrNotExist(id)
	}
	return m, nil
}

// Internal is the runtime seen across every namespace, for the sweeps the
// tenancy layer runs on its own behalf (retiring a generation, admission
// limits). No id a caller names reaches it.
type Internal struct{ r *Runtime }

// Internal returns the runtime's view across namespaces.
func (r *Runtime) Internal() Internal { return Internal{r} }

// Sessions returns every session of every namespace, oldest first.
func (i Internal) Sessions() []SessionInfo {
	return i.r.sessions.list(func(string) bool { return true })
}

// DeleteSession deletes the session stored under a physical id.
func (i Internal) DeleteSession(ctx context.Context, physical string) error {
	return i.r.deleteSession(ctx, physical)
}
