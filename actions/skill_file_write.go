package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

type writeSkillFileParams struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Content string `json:"content"`
}

// writeSkillFile: box_write_skill_file {"name", "path", "content"=""} →
// {"skill": {"name"}, "path", "bytes_written"}.
func (d *Dispatcher) writeSkillFile(ctx context.Context, p writeSkillFileParams) (skills.WriteResult, error) {
	out, err := d.skillStore(ctx).WriteFile(ctx, p.Name, p.Path, p.Content)
	return out, skillErr(err)
}
