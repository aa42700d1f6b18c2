package actions

import "context"

// ping answers {} with {}: the heartbeat.
func (d *Dispatcher) ping(context.Context, none) (struct{}, error) { return struct{}{}, nil }
