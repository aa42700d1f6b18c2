package actions

import (
	"context"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

// createSession creates or reuses a session; cmd is ignored.
func (d *Dispatcher) createSession(ctx context.Context, req *rpc.Request) (any, error) {
	spec, err := backends.DecodeSpec(req.Params)
	if err != nil {
		return nil, err
	}
	return d.rt.EnsureSession(ctx, spec)
}

type sessionRef struct {
	SessionID string `json:"session_id"`
}

func decodeSessionRef(raw []byte) (string, error) {
	var ref sessionRef
	if err := backends.DecodeParams(raw, &ref); err != nil {
		return "", err
	}
	id := strings.TrimSpace(ref.SessionID)
	if id == "" {
		return "", boxerr.Validation("session_id", "session_id is required")
	}
	return id, nil
}

// getSession returns a session and its managed processes.
func (d *Dispatcher) getSession(_ context.Context, req *rpc.Request) (any, error) {
	id, err := decodeSessionRef(req.Params)
	if err != nil {
		return nil, err
	}
	return d.rt.GetSession(id)
}

// getSessions lists every session.
func (d *Dispatcher) getSessions(_ context.Context, req *rpc.Request) (any, error) {
	if err := noParams(req.Params); err != nil {
		return nil, err
	}
	return map[string]any{"sessions": d.rt.ListSessions()}, nil
}

// deleteSession stops a session's processes and removes its sandbox.
func (d *Dispatcher) deleteSession(ctx context.Context, req *rpc.Request) (any, error) {
	id, err := decodeSessionRef(req.Params)
	if err != nil {
		return nil, err
	}
	if err := d.rt.DeleteSession(ctx, id); err != nil {
		return nil, err
	}
	return map[string]string{"deleted": id}, nil
}
