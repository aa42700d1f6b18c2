package actions

import (
	"context"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/snapshots"
)

type snapshotRef struct {
	SnapshotID string `json:"snapshot_id"`
}

func (p *snapshotRef) validate() error {
	p.SnapshotID = strings.TrimSpace(p.SnapshotID)
	if p.SnapshotID == "" {
		return boxerr.Validation("snapshot_id", "snapshot_id is required")
	}
	return nil
}

// getSnapshot returns one snapshot's manifest.
func (d *Dispatcher) getSnapshot(ctx context.Context, p snapshotRef) (snapshots.Manifest, error) {
	return d.rt.Snapshots().Get(ctx, p.SnapshotID)
}
