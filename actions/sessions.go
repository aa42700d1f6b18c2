package actions

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

// specParams is box_create_session's params: a session spec, decoded with
// the spec's defaults and normalisation.
type specParams struct{ sessionSpec }

func (p *specParams) decodeParams(raw json.RawMessage) error {
	w := WireSpec{Spec: runtime.DefaultSpec()}
	return p.decodeMembers(raw, &w, &w)
}

// createSession creates or reuses a session; cmd is ignored.
func (d *Dispatcher) createSession(ctx context.Context, p specParams) (runtime.CreatedSession, error) {
	return d.rt.CreateSession(ctx, p.spec)
}

type sessionRef struct {
	SessionID string `json:"session_id"`
}

func (p *sessionRef) validate() error {
	p.SessionID = strings.TrimSpace(p.SessionID)
	if p.SessionID == "" {
		return boxerr.Validation("session_id", "session_id is required")
	}
	return nil
}

// getSession returns a session and its managed processes.
func (d *Dispatcher) getSession(ctx context.Context, p sessionRef) (runtime.SessionDetails, error) {
	d.rt.Reconcile(ctx)
	return d.rt.GetSession(ctx, p.SessionID)
}

type sessionList struct {
	Sessions []runtime.SessionInfo `json:"sessions"`
}

// getSessions lists every session.
func (d *Dispatcher) getSessions(ctx context.Context, _ none) (sessionList, error) {
	d.rt.Reconcile(ctx)
	return sessionList{Sessions: d.rt.ListSessions(ctx)}, nil
}

type deleted struct {
	Deleted string `json:"deleted"`
}

// deleteSession stops a session's processes and removes its sandbox.
func (d *Dispatcher) deleteSession(ctx context.Context, p sessionRef) (deleted, error) {
	return deleted{Deleted: p.SessionID}, d.rt.DeleteSession(ctx, p.SessionID)
}
