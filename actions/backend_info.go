package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

// backendInfo answers from the health cache, never from the engine; the
// first call starts measuring the backend's isolation in the background.
func (d *Dispatcher) backendInfo(context.Context, none) (runtime.BackendInfo, error) {
	return d.rt.MeasuredBackendInfo(), nil
}
