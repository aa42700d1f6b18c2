package actions

import (
	"context"

	"github.com/boxrt/boxrt/rpc"
)

// ping answers {} with {}: the heartbeat.
func (d *Dispatcher) ping(_ context.Context, req *rpc.Request) (any, error) {
	if err := noParams(req.Params); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}
