package actions

import (
	"context"
	"time"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
)

type exposePortParams struct {
	sessionRef
	Port   int `json:"port"`
	TTLSec int `json:"ttl_sec"`
}

func (p *exposePortParams) validate() error {
	if err := p.sessionRef.validate(); err != nil {
		return err
	}
	if p.Port < 1 || p.Port > 65535 {
		return boxerr.Validation("port", "port must be between 1 and 65535, got %d", p.Port)
	}
	if p.TTLSec < 0 || time.Duration(p.TTLSec)*time.Second > runtime.MaxPortTTL {
		return boxerr.Validation("ttl_sec", "ttl_sec must be between 1 and %d (0 or absent: %d), got %d",
			int(runtime.MaxPortTTL/time.Second), int(runtime.DefaultPortTTL/time.Second), p.TTLSec)
	}
	return nil
}

// exposePort: box_expose_port {"session_id", "port", "ttl_sec"?} →
// {"session_id", "port", "url", "token", "expires_at"}: the url on boxrt's
// listener reverse-proxies to 127.0.0.1:port in the session for holders
// of the token.
func (d *Dispatcher) exposePort(ctx context.Context, p exposePortParams) (runtime.Exposure, error) {
	base := ""
	if d.server.RelayURL != nil {
		base = d.server.RelayURL()
	}
	if base == "" {
		return runtime.Exposure{}, boxerr.Failure("box_expose_port needs boxrt's HTTP listener, which this boxrt does not run (serve with --listen)")
	}
	e, err := d.rt.Ports().Expose(ctx, p.SessionID, p.Port, time.Duration(p.TTLSec)*time.Second)
	if err != nil {
		return e, err
	}
	e.URL = base + e.Path
	return e, nil
}

type unexposePortParams struct {
	sessionRef
	Port int `json:"port"`
}

type unexposeResult struct {
	Unexposed bool `json:"unexposed"`
}

// unexposePort: box_unexpose_port {"session_id", "port"} → {"unexposed"}
// (false when the port was not exposed); the token stops working at once.
func (d *Dispatcher) unexposePort(ctx context.Context, p unexposePortParams) (unexposeResult, error) {
	ok, err := d.rt.Ports().Unexpose(ctx, p.SessionID, p.Port)
	return unexposeResult{Unexposed: ok}, err
}
