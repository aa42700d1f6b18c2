package runtime

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/boxrt/boxrt/backends"
)

// reasonTTL is the destroy reason of the reaper; destroy counts it in
// TotalReaped.
const reasonTTL = "ttl"

// reaperInterval is min(30 s, TTL); 0 when reaping is off.
func reaperInterval(ttl time.Duration) time.Duration {
	if ttl <= 0 {
		return 0
	}
	return min(30*time.Second, ttl)
}

func (r *Runtime) reaperLoop(ctx context.Context) {
	for {
		interval := reaperInterval(time.Duration(r.Config().Limits.SessionTTLSec) * time.Second)
		var tick <-chan time.Time
		stop := func() {}
		if interval > 0 {
			tick, stop = r.clock.NewTicker(interval)
		}
		select {
		case <-ctx.Done():
			stop()
			return
		case <-r.reaperKick:
			stop()
			continue
		case <-tick:
			stop()
			r.Reap(ctx)
		}
	}
}

// sharedBackend is a backend whose sessions other boxrt processes may use
// too (kube: replicas sharing a namespace). Before reaping a session the
// reaper asks it when the session was last used anywhere, so one replica
// never reaps a session another is serving.
type sharedBackend interface {
	LastUsed(ctx context.Context, info backends.Session) (time.Time, error)
}

// usedElsewhere returns a use of the session info after cutoff that b
// knows of.
func usedElsewhere(ctx context.Context, b backends.Backend, info backends.Session, cutoff time.Time) (time.Time, bool) {
	sb, ok := b.(sharedBackend)
	if !ok {
		return time.Time{}, false
	}
	last, err := sb.LastUsed(ctx, info)
	if err != nil || !last.After(cutoff) {
		return time.Time{}, false
	}
	return last, true
}

// Reap deals with idle sessions (unused for longer than the TTL, with no
// exec and no managed process running, not suspended already) as
// durable.idle_policy says: suspend or destroy (see idleAction). It also
// purges expired managed-process exit records. It returns how many
// sessions it destroyed or suspended.
func (r *Runtime) Reap(ctx context.Context) int {
	r.procs.purgeExitRecords()
	cfg := r.Config()
	ttl := time.Duration(cfg.Limits.SessionTTLSec) * time.Second
	if ttl <= 0 {
		return 0
	}
	b := r.backends.current()
	cutoff := r.clock.Now().Add(-ttl)
	policy := cfg.Durable.IdlePolicy
	idle := func(s *session, info backends.Session) bool {
		return r.procs.table.runningIn(s) == 0 && idleAction(b, info, policy) != ""
	}
	var candidates []*session
	for _, s := range r.sessions.idle(cutoff) {
		if idle(s, r.sessions.info(s)) {
			candidates = append(candidates, s)
		}
	}
	done := 0
	for _, s := range candidates {
		r.sessions.underID(s.info.SessionID, func() {
			// Re-checked under the id lock: an exec may have picked it up.
			info, still := r.sessions.stillIdle(s, cutoff)
			if !still || !idle(s, info) {
				return
			}
			if last, ok := usedElsewhere(ctx, b, info, cutoff); ok {
				r.sessions.usedAt(s, last)
				return
			}
			if idleAction(b, info, policy) == IdleSuspend {
				if err := r.suspend(ctx, b, s, reasonTTL); err != nil {
					r.log.Warn().Err(err).Str("session_id", info.SessionID).Msg("cannot suspend idle session")
					return
				}
			} else if err := r.destroy(ctx, s, reasonTTL, false); err != nil {
				return
			}
			done++
		})
	}
	return done
}

// idleAction is what the reaper does with an idle session under policy:
// IdleSuspend, IdleDestroy or "" (keep it running). Backends that cannot
// suspend (or not this session: SuspendChecker) keep persistent sessions
// running and destroy the others, whatever the policy.
func idleAction(b backends.Backend, info backends.Session, policy string) string {
	_, canSuspend := b.(backends.Suspender)
	if sc, ok := b.(backends.SuspendChecker); ok && canSuspend {
		canSuspend = sc.CanSuspend(info)
	}
	switch {
	case canSuspend && (policy == IdleSuspend || (policy == IdleAuto && info.Persistent)):
		return IdleSuspend
	case info.Persistent:
		return ""
	}
	return IdleDestroy
}

// touchEvery bounds how often per-line relay traffic refreshes a session's
// last use; the TTL is counted in seconds anyway.
const touchEvery = time.Second

// throttledTouch returns a touch for sessionID that does the work at most
// once per touchEvery.
func (t *sessionTable) throttledTouch(sessionID string) func() {
	var last atomic.Int64
	return func() {
		now := t.clock.Now().UnixNano()
		prev := last.Load()
		if now-prev < int64(touchEvery) || !last.CompareAndSwap(prev, now) {
			return
		}
		t.touch(sessionID)
	}
}
