package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

// backendInfo answers from the health cache, never from the engine.
func (d *Dispatcher) backendInfo(context.Context, none) (runtime.BackendInfo, error) {
	return d.rt.BackendInfo(), nil
}
