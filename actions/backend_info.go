package actions

import (
	"context"

	"github.com/boxrt/boxrt/rpc"
)

// backendInfo answers from the health cache, never from the engine.
func (d *Dispatcher) backendInfo(_ context.Context, req *rpc.Request) (any, error) {
	if err := noParams(req.Params); err != nil {
		return nil, err
	}
	return d.rt.BackendInfo(), nil
}
