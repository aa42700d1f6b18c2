package actions

import (
	"context"
	"encoding/json"
)

// configPatch is box_init's params: a config object the runtime merges
// and validates itself.
type configPatch struct{ raw json.RawMessage }

func (p *configPatch) decodeParams(raw json.RawMessage) error {
	p.raw = raw
	return nil
}

type initResult struct {
	IgnoredKeys []string `json:"ignored_keys"`
	Initialized bool     `json:"initialized"`
}

// init merges a config object (backend, limits, local, docker, e2b) into the
// running configuration, atomically. Keys boxrt does not know are ignored
// and listed in ignored_keys.
func (d *Dispatcher) init(ctx context.Context, p configPatch) (initResult, error) {
	ignored, err := d.rt.ApplyConfig(ctx, p.raw, DecodeParams)
	if err != nil {
		return initResult{}, err
	}
	if ignored == nil {
		ignored = []string{}
	}
	return initResult{IgnoredKeys: ignored, Initialized: true}, nil
}
