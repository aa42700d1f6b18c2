package actions

import (
	"context"

	"github.com/boxrt/boxrt/rpc"
)

type healthResult struct {
	Name       *string `json:"name"`
	Available  bool    `json:"available"`
	Version    string  `json:"version"`
	RelayURL   *string `json:"relay_url"`
	RelayToken string  `json:"relay_token,omitempty"`
}

// health reports the cached backend state and where the relay listens.
// The generated relay token is only ever returned over stdio, the channel
// the host already trusts.
func (d *Dispatcher) health(ctx context.Context, _ none) (healthResult, error) {
	info := d.rt.BackendInfo()
	res := healthResult{Name: info.Name, Available: info.Available, Version: d.server.Version, RelayURL: d.relayURL()}
	if rpc.TransportFrom(ctx) == rpc.TransportStdio {
		res.RelayToken = d.server.RelayToken
	}
	return res, nil
}

func (d *Dispatcher) relayURL() *string {
	if d.server.RelayURL == nil {
		return nil
	}
	if u := d.server.RelayURL(); u != "" {
		return &u
	}
	return nil
}
