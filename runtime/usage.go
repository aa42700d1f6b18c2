package runtime

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// UsageReader is a backend that measures a session's use: its cgroup's
// CPU, memory and processes, its disk, its network namespace's traffic.
type UsageReader interface {
	SessionUsage(ctx context.Context, info backends.Session) (backends.Usage, error)
}

// SessionMetrics is box_get_session_metrics's result.
type SessionMetrics struct {
	SessionID string    `json:"session_id"`
	Backend   string    `json:"backend"`
	State     string    `json:"state"`
	At        time.Time `json:"at"`
	backends.Usage
}

// SessionMetrics measures session id of ctx's namespace. A suspended
// session runs nothing: its CPU, memory and processes read 0.
func (r *Runtime) SessionMetrics(ctx context.Context, id string) (SessionMetrics, error) {
	physical, err := resolve(ctx, id)
	if err != nil {
		return SessionMetrics{}, err
	}
	return r.sessionMetrics(ctx, physical, id)
}

// MetricsConfig turns on /metrics series beyond boxrt's own.
type MetricsConfig struct {
	// SessionUsage adds each session's usage (box_get_session_metrics)
	// as series labelled by session and backend, for at most
	// MaxUsageSeries sessions (the oldest), measured at scrape time.
	SessionUsage FlexBool `json:"session_usage"`
}

// MaxUsageSeries bounds the sessions metrics.session_usage labels.
const MaxUsageSeries = 100

// Usage measures up to limit sessions of every namespace, oldest first,
// for the operator's /metrics (metrics.session_usage); a session that
// cannot be measured (gone meanwhile) is left out.
func (i Internal) Usage(ctx context.Context, limit int) []SessionMetrics {
	var out []SessionMetrics
	for _, s := range i.Sessions() {
		if len(out) == limit || ctx.Err() != nil {
			break
		}
		if m, err := i.r.sessionMetrics(ctx, s.SessionID, s.SessionID); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// sessionMetrics measures the session with physical id (named id by the
// caller).
func (r *Runtime) sessionMetrics(ctx context.Context, physical, id string) (SessionMetrics, error) {
	s := r.sessions.get(physical)
	if s == nil {
		return SessionMetrics{}, boxerr.SessionNotFound(id)
	}
	info := r.sessions.info(s)
	b := r.backends.current()
	ur, ok := b.(UsageReader)
	if !ok {
		return SessionMetrics{}, boxerr.Failure("this backend cannot measure a session's use (bwrap and docker can)")
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	u, err := ur.SessionUsage(mctx, info)
	if err != nil {
		return SessionMetrics{}, err
	}
	if es := r.egress.proxy.Session(physical); es != nil {
		// A session with network reaches out only through the proxy, over
		// its namespace's loopback, which the backend does not count.
		st := es.Stats()
		u.NetRxBytes, u.NetTxBytes = int64(st.BytesIn), int64(st.BytesOut)
	}
	state := info.State
	if state == "" {
		state = backends.StateRunning
	}
	return SessionMetrics{SessionID: physical, Backend: b.Name(), State: state, At: r.clock.Now().UTC(), Usage: u}, nil
}
