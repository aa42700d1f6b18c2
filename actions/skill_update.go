package actions

import (
	"context"

	"github.com/boxrt/boxrt/internal/boxerr"
)

type updateSkillParams struct {
	Name  string      `json:"name"`
	Skill *skillInput `json:"skill"`
}

func (p *updateSkillParams) validate() error {
	if p.Skill == nil {
		return boxerr.Validation("skill", "skill is required")
	}
	return nil
}

// updateSkill: box_update_skill {"name", "skill": {…}} → {"skill": Skill}.
// Renaming and changing package_root are refused.
func (d *Dispatcher) updateSkill(ctx context.Context, p updateSkillParams) (skillResult, error) {
	sk, err := d.skillStore(ctx).Update(ctx, p.Name, p.Skill.store())
	return skillResult{Skill: &sk}, skillErr(err)
}
