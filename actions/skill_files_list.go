package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

type listSkillFilesParams struct {
	Name          string `json:"name"`
	Path          string `json:"path"`
	IncludeHidden bool   `json:"include_hidden"`
	MaxEntries    int    `json:"max_entries"`
}

// listSkillFiles: box_list_skill_files {"name", "path"=".",
// "include_hidden"=false, "max_entries"=200} → {"skill": {"name"},
// "base_path", "entries": [{path, name, is_dir, size}], "truncated"}.
// max_entries must be a JSON integer ≥ 1 (capped at 1000).
func listSkillFiles(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		p := listSkillFilesParams{Path: ".", MaxEntries: skills.DefaultListEntries}
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		out, err := store.ListFiles(ctx, p.Name, skills.ListFilesOptions{
			Path: p.Path, IncludeHidden: p.IncludeHidden, MaxEntries: p.MaxEntries})
		if err != nil {
			return nil, skillErr(err)
		}
		return out, nil
	}
}
