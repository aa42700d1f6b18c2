package actions

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/boxrt/boxrt/runtime/tenant"
)

func TestInflightRetire(t *testing.T) {
	var f inflight
	p := func(ws string, gen int64) tenant.Placement {
		return tenant.Placement{Instance: "i", Workspace: ws, Generation: gen}
	}
	old, doneOld := f.start(context.Background(), p("w", 1))
	defer doneOld()
	cur, doneCur := f.start(context.Background(), p("w", 2))
	defer doneCur()
	other, doneOther := f.start(context.Background(), p("x", 1))
	defer doneOther()
	f.retire(p("w", 2))
	assert.True(t, retired(old), "the older generation's action is cancelled as retired")
	assert.NoError(t, cur.Err(), "the new generation's action runs on")
	assert.NoError(t, other.Err(), "another Workspace is untouched")
	doneCur()
	assert.False(t, retired(cur), "finishing is not retiring")
	doneOld()
	assert.NotContains(t, f.runs, fenceKey{"i", "w"}, "finished actions are forgotten")
}
