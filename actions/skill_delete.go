package actions

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime/skills"
)

// deleteSkill: box_delete_skill {"name"} → {"deleted": name}.
func deleteSkill(store *skills.Store) skillMethod {
	return func(ctx context.Context, raw json.RawMessage, _ string) (any, error) {
		var p skillNameParams
		if err := backends.DecodeParams(raw, &p); err != nil {
			return nil, err
		}
		if err := store.Delete(ctx, p.Name); err != nil {
			return nil, skillErr(err)
		}
		return map[string]string{"deleted": strings.TrimSpace(p.Name)}, nil
	}
}
