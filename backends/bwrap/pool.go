package bwrap

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Pooler = (*Backend)(nil)

// Claim implements backends.Pooler: session.json is rewritten (temp name,
// then rename) with the new owner's session id; the directory keeps its
// name. Claiming is on the path of a new session's first exec, so the
// pooled state is not read first: everything in it is replaced, and
// lookup has already checked the directory is one of ours.
func (b *Backend) Claim(_ context.Context, info backends.Session, spec backends.SandboxSpec) (backends.Session, error) {
	dir, err := b.lookup(info)
	if err != nil {
		return info, err
	}
	claimed := spec.Session(BackendName, info.BackendSessionID)
	claimed.CreatedAt = time.Now().UTC()
	claimed.LastUsedAt = claimed.CreatedAt
	st := stateFile{Format: stateFormat, InstanceID: b.cfg.InstanceID, Session: claimed}
	if err := writeState(dir, st); err != nil {
		return info, boxerr.Failure("bwrap: claiming pooled session %s: %v", info.BackendSessionID, err).Wrap(err)
	}
	res := &b.files(info.BackendSessionID).res
	res.mu.Lock()
	res.pooled, res.busyAt = false, time.Now() // its idle time starts now
	res.mu.Unlock()
	if claimed.Persistent {
		// The pool's sandbox ends with boxrt; a persistent session's must
		// not (persist.go): its first call starts that one. Nothing of the
		// new owner runs in it yet.
		res.close()
	}
	return claimed, nil
}
