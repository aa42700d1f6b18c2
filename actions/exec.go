package actions

import (
	"context"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/rpc"
)

// exec runs a command in a session, creating or reusing it.
func (d *Dispatcher) exec(ctx context.Context, req *rpc.Request) (any, error) {
	spec, err := backends.DecodeSpec(req.Params)
	if err != nil {
		return nil, err
	}
	return d.rt.Exec(ctx, spec)
}
