package runtime

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// restartStopped starts s's sandbox again when its backend can
// (backends.Restarter) and the sandbox stopped without being removed, as
// every container does when a Docker engine without live-restore
// restarts. The exec that found it stopped then runs in it, with the
// session's files, instead of in an empty replacement. It reports whether
// the sandbox runs again.
func (e *Execs) restartStopped(ctx context.Context, id string, s *session) (restarted bool) {
	e.r.sessions.underID(id, func() { restarted = e.restart(ctx, id, s) })
	return restarted
}

// restart is restartStopped under the id lock.
func (e *Execs) restart(ctx context.Context, id string, s *session) bool {
	r := e.r
	info, ok := r.sessions.current(id, s)
	rs, restarter := r.backends.current().(backends.Restarter)
	if !restarter || !ok || info.State == backends.StateSuspended {
		return false
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := rs.Restart(sctx, info); err != nil {
		r.log.Info().Err(err).Str("session_id", info.SessionID).Msg("the stopped sandbox cannot be started again")
		return false
	}
	r.log.Warn().Str("session_id", info.SessionID).Str("backend_session_id", info.BackendSessionID).
		Msg("the session's sandbox had stopped (its engine restarted?); started it again: files kept, processes gone")
	r.events.publish(info.SessionID, EventRestarted, map[string]any{"reason": "sandbox stopped"})
	return true
}
