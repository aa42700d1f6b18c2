package actions

import (
	"context"
	"encoding/json"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

type writeSkillFileParams struct {
	Name    string `json:"name"`
	Path    string `json:"path"`
	Content string `json:"content"`
}

// writeSkillFile: box_write_skill_file {"name", "path", "content"=""} →
// {"skill": {"name"}, "path", "bytes_written"}.
func writeSkillFile(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p writeSkillFileParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		out, err := store.WriteFile(ctx, p.Name, p.Path, p.Content)
		if err != nil {
			return nil, skillErr(err)
		}
		return out, nil
	}
}
