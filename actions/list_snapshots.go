package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/snapshots"
)

type snapshotList struct {
	Snapshots []snapshots.Manifest `json:"snapshots"`
}

// listSnapshots lists the stored snapshots, oldest first.
func (d *Dispatcher) listSnapshots(ctx context.Context, _ none) (snapshotList, error) {
	list, err := d.rt.Snapshots().List(ctx)
	return snapshotList{Snapshots: list}, err
}
