package actions

import (
	"context"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

type startProcessParams struct {
	SessionID string                `json:"session_id"`
	Spec      *backends.ProcessSpec `json:"spec"`
}

func (p *startProcessParams) validate() error {
	p.SessionID = strings.TrimSpace(p.SessionID)
	if p.SessionID == "" {
		return boxerr.Validation("session_id", "session_id is required")
	}
	if p.Spec == nil {
		return boxerr.Validation("spec", "spec is required")
	}
	return nil
}

// startProcess starts (or replaces) a managed process in a session.
func (d *Dispatcher) startProcess(ctx context.Context, p startProcessParams) (runtime.ProcessInfo, error) {
	return d.rt.Processes().Start(ctx, p.SessionID, *p.Spec)
}

type processRef struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
}

func (p *processRef) validate() error {
	p.SessionID = strings.TrimSpace(p.SessionID)
	if p.SessionID == "" {
		return boxerr.Validation("session_id", "session_id is required")
	}
	return nil
}

// getProcess reports a managed process; env values are never returned.
func (d *Dispatcher) getProcess(ctx context.Context, p processRef) (runtime.ProcessInfo, error) {
	return d.rt.Processes().Get(ctx, p.SessionID, p.ProcessID)
}

type stopped struct {
	Stopped string `json:"stopped"`
}

// stopProcess terminates a managed process (stdin close, SIGTERM, 5 s,
// SIGKILL, whole tree) and forgets it.
func (d *Dispatcher) stopProcess(ctx context.Context, p processRef) (stopped, error) {
	if err := d.rt.Processes().Stop(ctx, p.SessionID, p.ProcessID); err != nil {
		return stopped{}, err
	}
	if p.ProcessID == "" {
		p.ProcessID = "default"
	}
	return stopped{Stopped: p.ProcessID}, nil
}
