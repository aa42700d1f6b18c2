package actions

import (
	"encoding/json"
	"sync"
	"time"
)

// recentErrorsSize bounds the ring of recent errors box_status reports.
const recentErrorsSize = 32

// RecentError is one failed call, as box_status reports it. It holds the
// error text and identifiers only — never params, env values or tokens.
type RecentError struct {
	Time      time.Time `json:"time"`
	Method    string    `json:"method"`
	Type      string    `json:"type"`
	Code      int64     `json:"code"`
	Message   string    `json:"message"`
	SessionID string    `json:"session_id,omitempty"`
}

type errorRing struct {
	mu   sync.Mutex
	buf  []RecentError
	next int
}

func (r *errorRing) add(e RecentError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.buf) < recentErrorsSize {
		r.buf = append(r.buf, e)
		return
	}
	r.buf[r.next] = e
	r.next = (r.next + 1) % recentErrorsSize
}

// newestFirst returns a copy, most recent first.
func (r *errorRing) newestFirst() []RecentError {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]RecentError, 0, len(r.buf))
	for i := len(r.buf) - 1; i >= 0; i-- {
		out = append(out, r.buf[(r.next+i)%len(r.buf)])
	}
	return out
}

// sessionIDOf digs a session_id out of params for the error record.
func sessionIDOf(params json.RawMessage) string {
	var p struct {
		SessionID string `json:"session_id"`
	}
	if json.Unmarshal(params, &p) != nil {
		return ""
	}
	return p.SessionID
}
