package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

type statusResult struct {
	runtime.Status
	Version      string        `json:"version"`
	RelayURL     *string       `json:"relay_url"`
	RecentErrors []RecentError `json:"recent_errors"`
}

// status is the dashboard view: backend, counts, counters, limits, uptime.
func (d *Dispatcher) status(context.Context, none) (statusResult, error) {
	return statusResult{Status: d.rt.Status(), Version: d.server.Version, RelayURL: d.relayURL(),
		RecentErrors: d.errors.newestFirst()}, nil
}
