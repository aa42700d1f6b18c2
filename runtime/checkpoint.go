package runtime

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// fullSnapshotUnavailable is the answer to a snapshot in mode full. Saving
// memory and processes needs CRIU; boxrt asks CRIU whether it can work on
// this kernel and names the reason when it cannot. Where CRIU works,
// boxrt still does not checkpoint (docs/operations.md, "Durable
// sessions"), and says so.
func fullSnapshotUnavailable(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := backends.CRIUCheck(cctx); err != nil {
		return boxerr.Failure("snapshot mode full (memory and processes) is not available on this machine: %v; use mode filesystem", err).
			With("mode", "full").With("reason", "criu_unavailable").Wrap(err)
	}
	return boxerr.Failure("snapshot mode full (memory and processes) is not implemented by boxrt: CRIU works on this machine, but boxrt only takes filesystem snapshots; use mode filesystem").
		With("mode", "full").With("reason", "not_implemented")
}
