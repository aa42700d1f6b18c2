package actions

import "context"

// deleteSnapshot removes a stored snapshot.
func (d *Dispatcher) deleteSnapshot(ctx context.Context, p snapshotRef) (deleted, error) {
	return deleted{Deleted: p.SnapshotID}, d.rt.Snapshots().Delete(ctx, p.SnapshotID)
}
