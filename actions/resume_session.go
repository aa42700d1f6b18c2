package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

// resumeSession resumes a suspended session.
func (d *Dispatcher) resumeSession(ctx context.Context, p sessionRef) (runtime.SessionInfo, error) {
	return d.rt.ResumeSession(ctx, p.SessionID)
}
