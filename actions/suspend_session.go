package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

// suspendSession stops everything a session runs and keeps its files.
func (d *Dispatcher) suspendSession(ctx context.Context, p sessionRef) (runtime.SessionInfo, error) {
	return d.rt.SuspendSession(ctx, p.SessionID)
}
