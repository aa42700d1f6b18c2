package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

type skillNameParams struct {
	Name string `json:"name"`
}

// getSkill: box_get_skill {"name"} → {"skill": Skill|null}.
func getSkill(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p skillNameParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		sk, err := store.Get(ctx, p.Name)
		if err != nil {
			return nil, skillErr(err)
		}
		return map[string]any{"skill": sk}, nil
	}
}
