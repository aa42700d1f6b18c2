package bwrap

import (
	"context"
	"slices"

	"github.com/boxrt/boxrt/backends"
)

// StrictReadiness measures what LangBot's grant-enforced mode asks of the
// backend it runs as nsjail: namespace, mount and network isolation in a
// real throw-away sandbox over a directory of workspace, and the limits
// and storage bounds bwrap really enforces here. Of the storage facts only
// bounded_ephemeral_storage can hold (/tmp and /home live on the session's
// loop-mounted disk when boxrt is root); a managed session's workspace is
// a host_path, which that disk does not count, and skill storage is plain
// host directories, so the other three are false.
func (b *Backend) StrictReadiness(ctx context.Context, workspace string) backends.StrictReadiness {
	limits := b.cg.enforcedLimits()
	r := backends.StrictReadiness{
		CgroupV2:      b.cg.version == cgroupV2,
		CgroupVersion: b.cg.version.String(),
		CgroupLimits:  limits,
		CgroupLimitsEnforced: slices.Contains(limits, limitMemory) && slices.Contains(limits, limitPids) &&
			slices.Contains(limits, limitCPUs),
		BoundedEphemeralStorage: b.diskQuota,
	}
	iso, err := backends.ProbeStrictIsolation(ctx, b, workspace)
	r.NamespaceIsolation, r.MountIsolation, r.NetworkIsolation = iso.Namespace, iso.Mount, iso.Network
	if err != nil {
		r.Error = err.Error()
	}
	return r
}
