package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

type skillNameParams struct {
	Name string `json:"name"`
}

// skillResult is {"skill": Skill|null}.
type skillResult struct {
	Skill *skills.Skill `json:"skill"`
}

// getSkill: box_get_skill {"name"} → {"skill": Skill|null}.
func (d *Dispatcher) getSkill(ctx context.Context, p skillNameParams) (skillResult, error) {
	sk, err := d.skillStore(ctx).Get(ctx, p.Name)
	return skillResult{Skill: sk}, skillErr(err)
}
