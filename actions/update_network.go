package actions

import (
	"context"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

// NetworkNotification is the method of the notifications that report a
// connection or DNS question the egress proxy refused, sent to the caller
// of a box_exec while its command runs.
const NetworkNotification = "box_network_event"

// updateNetworkParams are box_update_network's: the session and its new
// network ("on", "off" or {"allow": [...], "deny": [...]}).
type updateNetworkParams struct {
	sessionRef
	Network backends.NetworkMode `json:"network"`
}

func (p *updateNetworkParams) validate() error {
	if err := p.sessionRef.validate(); err != nil {
		return err
	}
	if p.Network == "" {
		return boxerr.Validation("network", `network is required: "on", "off" or {"allow": [...], "deny": [...]}`)
	}
	return nil
}

// updateNetworkResult is box_update_network's answer.
type updateNetworkResult struct {
	SessionID string                 `json:"session_id"`
	Network   *runtime.NetworkStatus `json:"network"`
}

// updateNetwork changes a running session's egress policy live.
func (d *Dispatcher) updateNetwork(ctx context.Context, p updateNetworkParams) (updateNetworkResult, error) {
	st, err := d.rt.UpdateNetwork(ctx, p.SessionID, p.Network)
	if err != nil {
		return updateNetworkResult{}, err
	}
	return updateNetworkResult{SessionID: p.SessionID, Network: st}, nil
}

// networkEvent is box_network_event's params.
type networkEvent struct {
	SessionID string `json:"session_id"`
	runtime.NetworkEvent
}

// watchNetwork sends the session's denials to ctx's connection until stop.
func (d *Dispatcher) watchNetwork(ctx context.Context, sessionID string) (stop func()) {
	return d.rt.WatchNetwork(ctx, sessionID, func(ev runtime.NetworkEvent) {
		_ = rpc.Notify(ctx, NetworkNotification, networkEvent{SessionID: sessionID, NetworkEvent: ev})
	})
}
