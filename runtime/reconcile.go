package runtime

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// reconcileTimeout bounds the backend's answer: a listing must not hang on
// an engine that does not answer; then the table is reported as it is.
const reconcileTimeout = 5 * time.Second

// Reconcile checks the session table against the backend before it is
// reported (box_get_session, box_get_sessions): a session whose sandbox is
// gone (a container removed behind boxrt's back, a bwrap session directory
// deleted) is marked StateLost, and its next use creates it again (that
// call says session_created). Cost: with a backends.Census one call for
// all sessions (docker: one container list by label; bwrap: one directory
// read and a stat per session); otherwise one Alive per running session.
func (r *Runtime) Reconcile(ctx context.Context) {
	b := r.backends.current()
	check := r.sessions.checkable()
	if b == nil || len(check) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	exists := func(e reconcileEntry) bool { return e.suspended || b.Alive(ctx, e.info) }
	if c, ok := b.(backends.Census); ok {
		have, err := c.Existing(ctx)
		if err != nil {
			r.log.Debug().Err(err).Msg("cannot check sessions against the backend")
			return
		}
		exists = func(e reconcileEntry) bool { return have[e.backendID] }
	}
	var lost []reconcileEntry
	for _, e := range check {
		if !exists(e) {
			lost = append(lost, e)
		}
	}
	if ctx.Err() != nil {
		return // an Alive cut short says nothing
	}
	for _, e := range r.sessions.markLost(lost) {
		r.log.Warn().Str("session_id", e.sessionID).Str("backend_session_id", e.backendID).
			Msg("session lost: its sandbox is gone; the next use creates it again")
	}
}
