package actions

import "context"

// shutdown destroys every session, persistent ones included; the runtime
// keeps serving (reference semantics).
func (d *Dispatcher) shutdown(ctx context.Context, _ none) (struct{}, error) {
	return struct{}{}, d.rt.ShutdownAll(ctx)
}
