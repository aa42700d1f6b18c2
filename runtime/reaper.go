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
	defer r.bg.Done()
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

// usedElsewhere reports whether b knows of a use of s after cutoff, and
// records it as the session's last use.
func (r *Runtime) usedElsewhere(ctx context.Context, s *session, cutoff time.Time) bool {
	r.mu.Lock()
	sb, ok := r.backend.(sharedBackend)
	info := s.info
	r.mu.Unlock()
	if !ok {
		return false
	}
	last, err := sb.LastUsed(ctx, info)
	if err != nil || !last.After(cutoff) {
		return false
	}
	r.mu.Lock()
	if last.After(s.info.LastUsedAt) {
		s.info.LastUsedAt = last
	}
	r.mu.Unlock()
	return true
}

// Reap deals with idle sessions (unused for longer than the TTL, with no
// exec and no managed process running, not suspended already) as
// durable.idle_policy says: suspend or destroy (see idleAction). It also
// purges expired managed-process exit records. It returns how many
// sessions it destroyed or suspended.
func (r *Runtime) Reap(ctx context.Context) int {
	r.purgeExitRecords()
	r.mu.Lock()
	ttl := time.Duration(r.cfg.Limits.SessionTTLSec) * time.Second
	if ttl <= 0 {
		r.mu.Unlock()
		return 0
	}
	b := r.backend
	cutoff := r.clock.Now().Add(-ttl)
	idle := func(s *session) bool {
		return !s.deleting && s.activeExecs == 0 && s.info.State != backends.StateSuspended &&
			s.runningProcesses() == 0 && s.info.LastUsedAt.Before(cutoff) && r.idleAction(b, s) != ""
	}
	var candidates []*session
	for _, s := range r.sessions {
		if idle(s) {
			candidates = append(candidates, s)
		}
	}
	r.mu.Unlock()
	reaped, suspended := 0, 0
	for _, s := range candidates {
		unlock := r.idLocks.Lock(s.info.SessionID)
		r.mu.Lock()
		// Re-check under the id lock: an exec may have picked it up.
		still := r.sessions[s.info.SessionID] == s && idle(s)
		action := r.idleAction(b, s)
		r.mu.Unlock()
		switch {
		case !still || r.usedElsewhere(ctx, s, cutoff):
		case action == IdleSuspend:
			if err := r.suspendLocked(ctx, b, s, reasonTTL); err == nil {
				suspended++
			} else {
				r.log.Warn().Err(err).Str("session_id", s.info.SessionID).Msg("cannot suspend idle session")
			}
		default:
			if err := r.destroy(ctx, s, reasonTTL, false); err == nil {
				reaped++
			}
		}
		unlock()
	}
	return reaped + suspended
}

// idleAction is what the reaper does with idle session s under the
// configured policy: IdleSuspend, IdleDestroy or "" (keep it running).
// Backends that cannot suspend (or not this session: SuspendChecker) keep
// persistent sessions running and destroy the others, whatever the policy. Runtime.mu is held.
func (r *Runtime) idleAction(b backends.Backend, s *session) string {
	_, canSuspend := b.(backends.Suspender)
	if sc, ok := b.(backends.SuspendChecker); ok && canSuspend {
		canSuspend = sc.CanSuspend(s.info)
	}
	policy := r.cfg.Durable.IdlePolicy
	switch {
	case canSuspend && (policy == IdleSuspend || (policy == IdleAuto && s.info.Persistent)):
		return IdleSuspend
	case s.info.Persistent:
		return ""
	}
	return IdleDestroy
}

// touch marks a session (a physical id) as used now (relay traffic counts
// as activity).
func (r *Runtime) touch(sessionID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.sessions[sessionID]; ok {
		s.info.LastUsedAt = r.clock.Now()
	}
}

// touchEvery bounds how often per-line relay traffic refreshes a session's
// last use; the TTL is counted in seconds anyway.
const touchEvery = time.Second

// throttledTouch returns a touch for sessionID that does the work at most
// once per touchEvery.
func (r *Runtime) throttledTouch(sessionID string) func() {
	var last atomic.Int64
	return func() {
		now := r.clock.Now().UnixNano()
		prev := last.Load()
		if now-prev < int64(touchEvery) || !last.CompareAndSwap(prev, now) {
			return
		}
		r.touch(sessionID)
	}
}
