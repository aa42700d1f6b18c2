package bwrap

import (
	"context"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.Suspender = (*Backend)(nil)

// Suspend implements backends.Suspender: what still runs for the session
// is killed, its stage detached (the disk unmounted, the loop device and a
// session's egress attachment gone) and session.json rewritten with
// State suspended (temp name, then rename). The directory with disk.img
// stays; Adopt reports it suspended after a restart.
func (b *Backend) Suspend(ctx context.Context, info backends.Session) error {
	return b.setState(ctx, info, backends.StateSuspended)
}

// Resume implements backends.Suspender: session.json is marked running
// again. Storage and network come back lazily with the next run, as after
// an adoption.
func (b *Backend) Resume(ctx context.Context, info backends.Session) error {
	return b.setState(ctx, info, backends.StateRunning)
}

func (b *Backend) setState(ctx context.Context, info backends.Session, state string) error {
	dir, err := b.lookup(info)
	if err != nil {
		return err
	}
	key := info.BackendSessionID
	release, err := b.quiesce(ctx, key)
	defer release()
	if err != nil {
		return err
	}
	if state == backends.StateSuspended {
		if err := b.dropFiles(key); err != nil {
			return boxerr.Failure("bwrap: suspending session %s: %v", info.SessionID, err).Wrap(err)
		}
	}
	st, err := readState(dir)
	if err != nil {
		return boxerr.Failure("bwrap: session %s: %v", info.SessionID, err).Wrap(err)
	}
	st.Session.State = state
	st.Sandbox = nil // ended by quiesce
	if err := writeState(dir, st); err != nil {
		return backends.StateDirError("bwrap: session "+info.SessionID+": writing its state", err)
	}
	return nil
}
