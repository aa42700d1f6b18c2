package actions

import (
	"context"

	"github.com/boxrt/boxrt/rpc"
)

// shutdown destroys every session, persistent ones included; the runtime
// keeps serving (reference semantics).
func (d *Dispatcher) shutdown(ctx context.Context, req *rpc.Request) (any, error) {
	if err := noParams(req.Params); err != nil {
		return nil, err
	}
	if err := d.rt.ShutdownAll(ctx); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}
