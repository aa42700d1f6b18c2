package actions

import (
	"context"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

type forkParams struct {
	SessionID    string `json:"session_id"`
	NewSessionID string `json:"new_session_id"`
}

func (p *forkParams) validate() error {
	p.SessionID = strings.TrimSpace(p.SessionID)
	p.NewSessionID = strings.TrimSpace(p.NewSessionID)
	switch {
	case p.SessionID == "":
		return boxerr.Validation("session_id", "session_id is required")
	case p.NewSessionID == "":
		return boxerr.Validation("new_session_id", "new_session_id is required")
	case p.NewSessionID == p.SessionID:
		return boxerr.Validation("new_session_id", "new_session_id must differ from session_id")
	}
	return nil
}

// forkSession copies a running or suspended session into a new one.
func (d *Dispatcher) forkSession(ctx context.Context, p forkParams) (runtime.SessionInfo, error) {
	return d.rt.Snapshots().Fork(ctx, p.SessionID, p.NewSessionID)
}
