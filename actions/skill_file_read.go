package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

type readSkillFileParams struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// readSkillFile: box_read_skill_file {"name", "path"} → {"skill": {"name"},
// "path", "content"}; at most 1 MiB of UTF-8.
func readSkillFile(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p readSkillFileParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		out, err := store.ReadFile(ctx, p.Name, p.Path)
		if err != nil {
			return nil, skillErr(err)
		}
		return out, nil
	}
}
