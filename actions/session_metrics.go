package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

// sessionMetrics: box_get_session_metrics {"session_id"} → what the
// session uses now: CPU seconds, memory (current, peak, limit), disk
// (used, quota), network bytes in and out, processes.
func (d *Dispatcher) sessionMetrics(ctx context.Context, p sessionRef) (runtime.SessionMetrics, error) {
	return d.rt.SessionMetrics(ctx, p.SessionID)
}
