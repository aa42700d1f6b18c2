package runtime

import (
	"github.com/boxrt/boxrt/runtime/boxerr"
)

// Durable configures suspension, snapshots and warm pools (the "durable"
// section).
type Durable struct {
	// IdlePolicy is what the reaper does with an idle session: IdleAuto
	// (default), IdleSuspend or IdleDestroy.
	IdlePolicy string `json:"idle_policy"`
	// SnapshotDir is the local snapshot store; "" is <state dir>/snapshots.
	SnapshotDir string `json:"snapshot_dir"`
	// SnapshotMaxTotalMB bounds the store's total size (compressed).
	SnapshotMaxTotalMB int `json:"snapshot_max_total_mb"`
	// SnapshotHostPaths lets a snapshot copy a host_path workspace. Off by
	// default: the host's files stay the host's (extra mounts and skills
	// are never copied).
	SnapshotHostPaths bool `json:"snapshot_host_paths"`
}

// Durable defaults and bounds.
const (
	DefaultSnapshotMaxTotalMB = 10 << 10
	maxSnapshotMaxTotalMB     = 1 << 24
)

func defaultDurable() Durable {
	return Durable{IdlePolicy: IdleAuto, SnapshotMaxTotalMB: DefaultSnapshotMaxTotalMB}
}

func (d *Durable) validate() error {
	switch d.IdlePolicy {
	case IdleAuto, IdleSuspend, IdleDestroy:
	default:
		return boxerr.Validation("durable.idle_policy", "durable.idle_policy must be %q, %q or %q, got %q",
			IdleAuto, IdleSuspend, IdleDestroy, d.IdlePolicy)
	}
	if d.SnapshotMaxTotalMB < 1 || d.SnapshotMaxTotalMB > maxSnapshotMaxTotalMB {
		return boxerr.Validation("durable.snapshot_max_total_mb", "durable.snapshot_max_total_mb must be between 1 and %d, got %d",
			maxSnapshotMaxTotalMB, d.SnapshotMaxTotalMB)
	}
	return nil
}
