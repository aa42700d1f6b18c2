package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/boxerr"
	"github.com/boxrt/boxrt/runtime/skills"
)

type createSkillParams struct {
	Skill *skillInput `json:"skill"`
}

// createSkill: box_create_skill {"skill": {name, display_name?,
// description?, instructions?, package_root?}} → {"skill": Skill}.
func createSkill(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p createSkillParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		if p.Skill == nil {
			return nil, boxerr.Validation("skill", "skill is required")
		}
		sk, err := store.Create(ctx, p.Skill.store())
		if err != nil {
			return nil, skillErr(err)
		}
		return map[string]any{"skill": sk}, nil
	}
}
