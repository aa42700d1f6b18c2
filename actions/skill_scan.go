package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

type scanParams struct {
	Path string `json:"path"`
}

// scanSkillDirectory: box_scan_skill_directory {"path"} → the Skill itself
// (not wrapped, as in the reference). The path must be inside the store
// root; a relative one is taken relative to it.
func scanSkillDirectory(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p scanParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		sk, err := store.Scan(ctx, p.Path)
		if err != nil {
			return nil, skillErr(err)
		}
		return sk, nil
	}
}
