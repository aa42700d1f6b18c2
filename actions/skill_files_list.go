package actions

import (
	"context"

	"github.com/boxrt/boxrt/runtime/skills"
)

type listSkillFilesParams struct {
	Name          string `json:"name"`
	Path          string `json:"path"`
	IncludeHidden bool   `json:"include_hidden"`
	MaxEntries    int    `json:"max_entries"`
}

func (p *listSkillFilesParams) setDefaults() {
	p.Path, p.MaxEntries = ".", skills.DefaultListEntries
}

// listSkillFiles: box_list_skill_files {"name", "path"=".",
// "include_hidden"=false, "max_entries"=200} → {"skill": {"name"},
// "base_path", "entries": [{path, name, is_dir, size}], "truncated"}.
// max_entries must be a JSON integer ≥ 1 (capped at 1000).
func (d *Dispatcher) listSkillFiles(ctx context.Context, p listSkillFilesParams) (skills.FileListing, error) {
	out, err := d.skillStore(ctx).ListFiles(ctx, p.Name, skills.ListFilesOptions{
		Path: p.Path, IncludeHidden: p.IncludeHidden, MaxEntries: p.MaxEntries})
	return out, skillErr(err)
}
