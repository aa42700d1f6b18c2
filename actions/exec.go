package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime"
)

// exec runs a command in a session, creating or reusing it.
func (d *Dispatcher) exec(ctx context.Context, p specParams) (runtime.ExecResult, error) {
	return d.rt.Exec(ctx, p.spec)
}
