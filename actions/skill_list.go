package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

// skillList is the result of the methods that answer with several skills.
type skillList[S any] struct {
	Skills []S `json:"skills"`
}

// listSkills: box_list_skills {} → {"skills": [Skill…]}, newest first.
func (d *Dispatcher) listSkills(ctx context.Context, _ none) (skillList[skills.Skill], error) {
	list, err := d.skillStore(ctx).List(ctx)
	return skillList[skills.Skill]{Skills: list}, skillErr(err)
}
