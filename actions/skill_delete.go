package actions

import (
	"context"
	"strings"
)

// deleteSkill: box_delete_skill {"name"} → {"deleted": name}.
func (d *Dispatcher) deleteSkill(ctx context.Context, p skillNameParams) (deleted, error) {
	return deleted{Deleted: strings.TrimSpace(p.Name)}, skillErr(d.skillStore(ctx).Delete(ctx, p.Name))
}
