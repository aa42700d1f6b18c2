package tenant

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestPlacementIDs(t *testing.T) {
	p := Placement{Instance: "instance-a", Workspace: "workspace-a", Generation: 1}
	// The reference's worked example.
	require.Equal(t, "ws-695136eeae1cb9b6af4a8226", p.Namespace())
	tests := []struct {
		name, logical, physical, back string
		err                           string
	}{
		{name: "plain", logical: "s1", physical: "ws-695136eeae1cb9b6af4a8226-g1-s1", back: "s1"},
		{name: "runs collapse", logical: " my session//1 ", physical: "ws-695136eeae1cb9b6af4a8226-g1-my-session-1", back: "my-session-1"},
		{name: "dashes trimmed", logical: "--a--", physical: "ws-695136eeae1cb9b6af4a8226-g1-a", back: "a"},
		{name: "long host id", logical: "lb-box-" + strings.Repeat("ab", 32), physical: "ws-695136eeae1cb9b6af4a8226-g1-lb-box-" + strings.Repeat("ab", 32), back: "lb-box-" + strings.Repeat("ab", 32)},
		{name: "empty", logical: "  ", err: "Box session_id must not be empty"},
		{name: "no valid character", logical: "///", err: "Box session_id must contain a valid character"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.PhysicalID(tc.logical)
			if tc.err != "" {
				require.ErrorIs(t, err, boxerr.ErrValidation)
				assert.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.physical, got)
			assert.True(t, p.Owns(got))
			assert.Equal(t, tc.back, p.LogicalID(got))
		})
	}
	other := Placement{Instance: "instance-a", Workspace: "workspace-a", Generation: 2}
	assert.False(t, other.Owns("ws-695136eeae1cb9b6af4a8226-g1-s1"), "another generation owns none of them")
	assert.Equal(t, "ws-695136eeae1cb9b6af4a8226-g1-s1", other.LogicalID("ws-695136eeae1cb9b6af4a8226-g1-s1"))
	assert.False(t, p.Owns(p.Prefix()), "the bare prefix is no session")
}

func TestResolve(t *testing.T) {
	a := Placement{Instance: "instance-a", Workspace: "workspace-a", Generation: 1}
	b := Placement{Instance: "instance-a", Workspace: "workspace-b", Generation: 1}
	physA, err := a.PhysicalID("s1")
	require.NoError(t, err)

	ctxA := WithPlacement(context.Background(), a)
	got, err := Resolve(ctxA, "session_id", "s1")
	require.NoError(t, err)
	assert.Equal(t, physA, got)
	assert.True(t, Visible(ctxA, physA))

	ctxB := WithPlacement(context.Background(), b)
	got, err = Resolve(ctxB, "session_id", physA)
	require.NoError(t, err)
	assert.True(t, b.Owns(got), "another Workspace's physical id is only a logical id of B's own: %s", got)
	assert.False(t, Visible(ctxB, physA))
	assert.False(t, VisibleWorkspace(ctxB, physA))

	def := context.Background()
	_, err = Resolve(def, "new_session_id", physA)
	require.ErrorIs(t, err, boxerr.ErrValidation, "the default namespace never names a Workspace's session")
	assert.False(t, Visible(def, physA))
	got, err = Resolve(def, "session_id", "s1")
	require.NoError(t, err)
	assert.Equal(t, "s1", got)
	assert.True(t, Visible(def, "s1"))

	gen2 := WithPlacement(context.Background(), Placement{Instance: "instance-a", Workspace: "workspace-a", Generation: 2})
	assert.False(t, Visible(gen2, physA), "sessions belong to their generation")
	assert.True(t, VisibleWorkspace(gen2, physA), "snapshots to the Workspace")
	assert.Equal(t, "", Scope(def))
	assert.NotEqual(t, Scope(ctxA), Scope(ctxB))
}
