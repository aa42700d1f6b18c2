package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

func requireField(t *testing.T, err error, field string) {
	t.Helper()
	require.ErrorIs(t, err, boxerr.ErrValidation)
	var be *boxerr.Error
	require.True(t, errors.As(err, &be))
	assert.Equal(t, field, be.Details["field"], be.Msg)
}

func TestProcessIDsRefused(t *testing.T) {
	rt, _ := newTestRuntime(t, newFake(), "")
	ctx := context.Background()
	_, err := rt.EnsureSession(ctx, spec("p"))
	require.NoError(t, err)
	for _, tc := range []struct{ name, id string }{
		{"dot", "."},
		{"dot dot", ".."},
		{"space", " "},
		{"tab", "\t"},
		{"padded", " a "},
		{"slash", "a/b"},
		{"nul", "a\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rt.Processes().Start(ctx, "p", backends.ProcessSpec{ProcessID: tc.id, Command: "cat"})
			requireField(t, err, "spec.process_id")
			_, err = rt.Processes().Get(context.Background(), "p", tc.id)
			requireField(t, err, "process_id")
			requireField(t, rt.Processes().Stop(ctx, "p", tc.id), "process_id")
		})
	}
	t.Run("ordinary ids still work", func(t *testing.T) {
		for _, id := range []string{"", "default", "a.b", "...", "mcp-1"} {
			_, err := rt.Processes().Start(ctx, "p", backends.ProcessSpec{ProcessID: id, Command: "cat"})
			require.NoError(t, err, id)
			require.NoError(t, rt.Processes().Stop(ctx, "p", id), id)
		}
	})
}

func TestProcessSpecBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		mem  int
		ok   bool
	}{
		{"zero", 0, true},
		{"max", backends.MaxProcessMemoryMB, true},
		{"above max", backends.MaxProcessMemoryMB + 1, false},
		{"2^44", 1 << 44, false},
		{"negative", -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := NormalizeProcessSpec(&backends.ProcessSpec{Command: "x", MemoryMB: tc.mem})
			if tc.ok {
				require.NoError(t, err)
				return
			}
			requireField(t, err, "spec.memory_mb")
		})
	}
}

func TestMountRootsRefused(t *testing.T) {
	state := t.TempDir()
	host := t.TempDir()
	other := t.TempDir()
	link := filepath.Join(other, "to-root")
	require.NoError(t, os.Symlink("/", link))
	exe, err := os.Executable()
	require.NoError(t, err)
	tests := []struct {
		name string
		cfg  string
		ok   bool
	}{
		{"plain root", fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, other), true},
		{"slash", `{"local":{"allowed_mount_roots":["/"]}}`, false},
		{"double slash", `{"local":{"allowed_mount_roots":["//"]}}`, false},
		{"dot dot to slash", `{"local":{"allowed_mount_roots":["/tmp/../"]}}`, false},
		{"dot", `{"local":{"allowed_mount_roots":["/."]}}`, false},
		{"symlink to slash", fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, link), false},
		{"blank entry", `{"local":{"allowed_mount_roots":[" "]}}`, false},
		{"contains the state dir", fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, filepath.Dir(state)), false},
		{"is the state dir", fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, state+"/"), false},
		{"inside the state dir", fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, filepath.Join(state, "bwrap")), false},
		{"contains the skill store", fmt.Sprintf(`{"local":{"host_root":%q,"allowed_mount_roots":[%q]}}`, host, host), false},
		{"inside the skill store", fmt.Sprintf(`{"local":{"host_root":%q,"allowed_mount_roots":[%q]}}`, host, filepath.Join(host, "skills", "x")), false},
		{"absolute skill store inside", fmt.Sprintf(`{"local":{"skills_root":%q,"allowed_mount_roots":[%q]}}`, filepath.Join(other, "s"), other), false},
		{"contains boxrt's binary", fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, filepath.Dir(exe)), false},
		{"host_root only: the default workspace is the root", fmt.Sprintf(`{"local":{"host_root":%q}}`, host), true},
		{"default workspace is host_root", fmt.Sprintf(`{"local":{"host_root":%q,"default_workspace":"."}}`, host), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := DefaultConfig().Merge([]byte(tc.cfg), json.Unmarshal)
			if err == nil {
				_, err = New(cfg, nil, state)
			}
			if tc.ok {
				require.NoError(t, err)
				return
			}
			requireField(t, err, "local.allowed_mount_roots")
		})
	}
	t.Run("box_init cannot add a bad root", func(t *testing.T) {
		rt, _ := newTestRuntime(t, newFake(), "")
		_, err := rt.ApplyConfig(context.Background(), []byte(fmt.Sprintf(`{"local":{"allowed_mount_roots":[%q]}}`, filepath.Dir(rt.stateDir))), json.Unmarshal)
		requireField(t, err, "local.allowed_mount_roots")
		assert.Empty(t, rt.Config().Local.AllowedMountRoots, "config unchanged")
	})
}

// TestDefaultRootExcludesSkillStore: with only host_root set, a session may
// mount the default workspace but not the skill store next to it.
func TestDefaultRootExcludesSkillStore(t *testing.T) {
	host := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(host, "skills", "greeter"), 0o755))
	rt, _ := newTestRuntime(t, newFake(), fmt.Sprintf(`{"local":{"host_root":%q}}`, host))
	ctx := context.Background()
	for _, tc := range []struct {
		name, path string
		ok         bool
	}{
		{"default workspace", filepath.Join(host, "default", "tenants", "a"), true},
		{"skill store", filepath.Join(host, "skills"), false},
		{"a skill", filepath.Join(host, "skills", "greeter"), false},
		{"host_root itself", host, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec("root-" + tc.name)
			s.HostPath = tc.path
			_, err := rt.EnsureSession(ctx, s)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			requireField(t, err, "host_path")
		})
	}
}
