package actions

import (
	"context"

	"github.com/boxrt/boxrt/rpc"
)

// init merges a config object (backend, limits, local, docker, e2b) into the
// running configuration, atomically.
func (d *Dispatcher) init(ctx context.Context, req *rpc.Request) (any, error) {
	if err := d.rt.ApplyConfig(ctx, req.Params); err != nil {
		return nil, err
	}
	return map[string]bool{"initialized": true}, nil
}
