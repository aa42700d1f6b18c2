package actions

import (
	"context"

	"github.com/boxrt/boxrt/rpc"
)

// init merges a config object (backend, limits, local, docker, e2b) into the
// running configuration, atomically. Keys boxrt does not know are ignored
// and listed in ignored_keys.
func (d *Dispatcher) init(ctx context.Context, req *rpc.Request) (any, error) {
	ignored, err := d.rt.ApplyConfig(ctx, req.Params)
	if err != nil {
		return nil, err
	}
	if ignored == nil {
		ignored = []string{}
	}
	return map[string]any{"initialized": true, "ignored_keys": ignored}, nil
}
