package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/snapshots"
)

type snapshotParams struct {
	sessionRef
	Mode string `json:"mode"`
}

// snapshotSession stores a session's files as a snapshot.
func (d *Dispatcher) snapshotSession(ctx context.Context, p snapshotParams) (snapshots.Manifest, error) {
	return d.rt.Snapshots().Take(ctx, p.SessionID, p.Mode)
}
