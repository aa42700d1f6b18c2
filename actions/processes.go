package actions

import (
	"context"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime/boxerr"
)

type startProcessParams struct {
	SessionID string                `json:"session_id"`
	Spec      *backends.ProcessSpec `json:"spec"`
}

// startProcess starts (or replaces) a managed process in a session.
func (d *Dispatcher) startProcess(ctx context.Context, req *rpc.Request) (any, error) {
	var p startProcessParams
	if err := backends.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	p.SessionID = strings.TrimSpace(p.SessionID)
	if p.SessionID == "" {
		return nil, boxerr.Validation("session_id", "session_id is required")
	}
	if p.Spec == nil {
		return nil, boxerr.Validation("spec", "spec is required")
	}
	return d.rt.StartProcess(ctx, p.SessionID, *p.Spec)
}

type processRef struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
}

func decodeProcessRef(raw []byte) (processRef, error) {
	var ref processRef
	if err := backends.DecodeParams(raw, &ref); err != nil {
		return ref, err
	}
	ref.SessionID = strings.TrimSpace(ref.SessionID)
	if ref.SessionID == "" {
		return ref, boxerr.Validation("session_id", "session_id is required")
	}
	return ref, nil
}

// getProcess reports a managed process; env values are never returned.
func (d *Dispatcher) getProcess(_ context.Context, req *rpc.Request) (any, error) {
	ref, err := decodeProcessRef(req.Params)
	if err != nil {
		return nil, err
	}
	return d.rt.Process(ref.SessionID, ref.ProcessID)
}

// stopProcess terminates a managed process (stdin close, SIGTERM, 5 s,
// SIGKILL, whole tree) and forgets it.
func (d *Dispatcher) stopProcess(ctx context.Context, req *rpc.Request) (any, error) {
	ref, err := decodeProcessRef(req.Params)
	if err != nil {
		return nil, err
	}
	if err := d.rt.StopProcess(ctx, ref.SessionID, ref.ProcessID); err != nil {
		return nil, err
	}
	if ref.ProcessID == "" {
		ref.ProcessID = "default"
	}
	return map[string]string{"stopped": ref.ProcessID}, nil
}
