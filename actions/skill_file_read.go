package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

type readSkillFileParams struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// readSkillFile: box_read_skill_file {"name", "path"} → {"skill": {"name"},
// "path", "content"}; at most 1 MiB of UTF-8.
func (d *Dispatcher) readSkillFile(ctx context.Context, p readSkillFileParams) (skills.FileContent, error) {
	out, err := d.skillStore(ctx).ReadFile(ctx, p.Name, p.Path)
	return out, skillErr(err)
}
