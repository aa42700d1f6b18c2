package actions

import (
	"context"

	"github.com/boxrt/boxrt/internal/boxerr"
)

type createSkillParams struct {
	Skill *skillInput `json:"skill"`
}

func (p *createSkillParams) validate() error {
	if p.Skill == nil {
		return boxerr.Validation("skill", "skill is required")
	}
	return nil
}

// createSkill: box_create_skill {"skill": {name, display_name?,
// description?, instructions?, package_root?}} → {"skill": Skill}.
func (d *Dispatcher) createSkill(ctx context.Context, p createSkillParams) (skillResult, error) {
	sk, err := d.skillStore(ctx).Create(ctx, p.Skill.store())
	return skillResult{Skill: &sk}, skillErr(err)
}
