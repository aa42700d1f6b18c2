package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
	"github.com/boxrt/boxrt/runtime/skills"
)

type updateSkillParams struct {
	Name  string      `json:"name"`
	Skill *skillInput `json:"skill"`
}

// updateSkill: box_update_skill {"name", "skill": {…}} → {"skill": Skill}.
// Renaming and changing package_root are refused.
func updateSkill(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p updateSkillParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		if p.Skill == nil {
			return nil, boxerr.Validation("skill", "skill is required")
		}
		sk, err := store.Update(ctx, p.Name, p.Skill.store())
		if err != nil {
			return nil, skillErr(err)
		}
		return map[string]any{"skill": sk}, nil
	}
}
