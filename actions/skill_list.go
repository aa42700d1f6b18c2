package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/runtime/skills"
)

// listSkills: box_list_skills {} → {"skills": [Skill…]}, newest first.
func listSkills(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		if err := noParams(raw); err != nil {
			return nil, err
		}
		list, err := store.List(ctx)
		if err != nil {
			return nil, skillErr(err)
		}
		return map[string]any{"skills": list}, nil
	}
}
