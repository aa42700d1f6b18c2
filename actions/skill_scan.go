package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

type scanParams struct {
	Path string `json:"path"`
}

// scanSkillDirectory: box_scan_skill_directory {"path"} → the Skill itself
// (not wrapped, as in the reference). The path must be inside the store
// root; a relative one is taken relative to it.
func (d *Dispatcher) scanSkillDirectory(ctx context.Context, p scanParams) (skills.Skill, error) {
	sk, err := d.skillStore(ctx).Scan(ctx, p.Path)
	return sk, skillErr(err)
}
