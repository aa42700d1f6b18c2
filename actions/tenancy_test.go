package actions

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

func TestLogicalResult(t *testing.T) {
	p := tenant.Placement{Instance: "i", Workspace: "w", Generation: 7}
	phys, err := p.PhysicalID("s1")
	require.NoError(t, err)
	foreign := "ws-000000000000000000000000-g7-s1"
	type proc struct {
		SessionID string `json:"session_id"`
		N         uint64 `json:"n"`
	}
	type result struct {
		SessionID string           `json:"session_id"`
		Stdout    string           `json:"stdout"`
		Procs     map[string]*proc `json:"managed_processes"`
		List      []proc           `json:"list"`
		Backend   string           `json:"backend_session_id"`
		Decoded   any              `json:"decoded"`
		Bytes     []byte           `json:"bytes"`
	}
	shared := &proc{SessionID: phys, N: 12345678901234567890}
	in := result{
		SessionID: phys, Stdout: "<b>&", Procs: map[string]*proc{"default": shared},
		List: []proc{{SessionID: foreign}, {SessionID: phys}}, Backend: phys,
		Decoded: map[string]any{"session_id": phys, "nested": []any{map[string]any{"session_id": phys}}},
		Bytes:   []byte("raw"),
	}
	out := logicalResult(p, in)
	assert.Equal(t, "s1", out.SessionID)
	assert.Equal(t, "s1", out.Procs["default"].SessionID)
	assert.Equal(t, uint64(12345678901234567890), out.Procs["default"].N)
	assert.Equal(t, []proc{{SessionID: foreign}, {SessionID: "s1"}}, out.List, "another Workspace's id is left alone")
	assert.Equal(t, phys, out.Backend, "only session_id members are session ids")
	assert.Equal(t, map[string]any{"session_id": "s1", "nested": []any{map[string]any{"session_id": "s1"}}}, out.Decoded)
	assert.Equal(t, "<b>&", out.Stdout)
	assert.Equal(t, phys, shared.SessionID, "the runtime's own record is not changed")
	assert.Equal(t, phys, in.List[1].SessionID, "the input is not changed")
	assert.Equal(t, phys, in.Decoded.(map[string]any)["session_id"], "the input's maps are not changed")
}

func TestLogicalResultLeavesPlainTypesAlone(t *testing.T) {
	p := tenant.Placement{Instance: "i", Workspace: "w", Generation: 1}
	b := []byte("content")
	assert.Same(t, &b[0], &logicalResult(p, b)[0], "a byte slice is not copied")
	assert.Equal(t, 7, logicalResult(p, 7))
}

func TestFence(t *testing.T) {
	f := NewFence(func() int { return 2 })
	a := func(gen int64) tenant.Placement {
		return tenant.Placement{Instance: "i", Workspace: "a", Generation: gen}
	}
	steps := []struct {
		name     string
		p        tenant.Placement
		advanced bool
		err      string
	}{
		{name: "first sight", p: a(2), advanced: true},
		{name: "same generation", p: a(2)},
		{name: "lower is stale", p: a(1), err: "Stale Box placement generation"},
		{name: "higher advances", p: a(5), advanced: true},
		{name: "another workspace", p: tenant.Placement{Instance: "i", Workspace: "b", Generation: 1}, advanced: true},
		{name: "capacity", p: tenant.Placement{Instance: "i", Workspace: "c", Generation: 1}, err: "Box generation fence capacity reached; refusing an unbounded Workspace allocation"},
	}
	for _, s := range steps {
		advanced, err := f.Observe(s.p)
		if s.err != "" {
			require.ErrorIs(t, err, boxerr.ErrPermission, s.name)
			assert.EqualError(t, err, s.err, s.name)
			continue
		}
		require.NoError(t, err, s.name)
		assert.Equal(t, s.advanced, advanced, s.name)
	}
	assert.True(t, f.Holds(a(5)))
	assert.False(t, f.Holds(a(2)))
}

func TestTranslateLangBotConfig(t *testing.T) {
	tests := []struct {
		name, in, out, requested string
	}{
		{name: "nsjail runs as bwrap", in: `{"backend":"nsjail","enabled":true}`, out: `{"backend":"bwrap","enabled":true}`, requested: "nsjail"},
		{name: "e2b is boxrt's name", in: `{"backend":"e2b","limits":{"max_sessions":3}}`, out: `{"backend":"e2b","limits":{"max_sessions":3}}`},
		{name: "docker unchanged", in: `{"backend":"docker"}`, out: `{"backend":"docker"}`},
		{name: "local unchanged", in: `{"backend":"local"}`, out: `{"backend":"local"}`},
		{name: "no backend", in: `{"limits":{}}`, out: `{"limits":{}}`},
		{name: "not an object is left for the config", in: `[1]`, out: `[1]`},
		{name: "backend not a string is left for the config", in: `{"backend":5}`, out: `{"backend":5}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, requested, err := TranslateLangBotConfig(json.RawMessage(tc.in))
			require.NoError(t, err)
			assert.JSONEq(t, tc.out, string(out))
			assert.Equal(t, tc.requested, requested)
		})
	}
}

func TestTrust(t *testing.T) {
	pinned := NewTrust("", false)
	assert.False(t, pinned.Matches("a"), "a context never pins in LangBot mode")
	assert.True(t, pinned.Pin("a"))
	assert.False(t, pinned.Pin("b"), "the first control connection pinned a")
	assert.True(t, pinned.Matches("a"))

	jsonrpc := NewTrust("", true)
	assert.True(t, jsonrpc.Matches("x"), "the first JSON-RPC context pins")
	assert.False(t, jsonrpc.Matches("y"))

	configured := NewTrust(" inst ", false)
	assert.False(t, configured.Pin("other"))
	assert.True(t, configured.Matches("inst"))
}

func TestRelayPlacement(t *testing.T) {
	tests := []struct {
		name           string
		inst, ws, gen  string
		ok             bool
		wantGeneration int64
	}{
		{name: "valid", inst: "i", ws: "w", gen: "3", ok: true, wantGeneration: 3},
		{name: "padded", inst: " i ", ws: " w ", gen: " 3 ", ok: true, wantGeneration: 3},
		{name: "leading zero", inst: "i", ws: "w", gen: "03"},
		{name: "plus sign", inst: "i", ws: "w", gen: "+3"},
		{name: "zero", inst: "i", ws: "w", gen: "0"},
		{name: "no workspace", inst: "i", ws: " ", gen: "1"},
		{name: "long workspace", inst: "i", ws: strings.Repeat("w", 257), gen: "1"},
		{name: "bad instance", inst: "a b", ws: "w", gen: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := http.NewRequest("GET", "/", nil)
			require.NoError(t, err)
			r.Header.Set(HeaderInstanceID, tc.inst)
			r.Header.Set(HeaderWorkspaceID, tc.ws)
			r.Header.Set(HeaderPlacementGeneration, tc.gen)
			p, ok := relayPlacement(r)
			assert.Equal(t, tc.ok, ok)
			if ok {
				assert.Equal(t, tc.wantGeneration, p.Generation)
			}
		})
	}
}

func TestFitLangBotMountRoots(t *testing.T) {
	root := t.TempDir()
	other := t.TempDir()
	base := runtime.DefaultConfig()
	tests := []struct {
		name  string
		local string
		want  []string // nil: patch unchanged
	}{
		{name: "the host's default: a root holding the skill store is narrowed",
			local: `{"host_root":"` + root + `","default_workspace":"default","skills_root":"skills","allowed_mount_roots":["` + root + `","` + other + `"]}`,
			want:  []string{filepath.Join(root, "default"), other}},
		{name: "comma-separated roots", local: `{"host_root":"` + root + `","allowed_mount_roots":"` + root + `,` + other + `"}`,
			want: []string{filepath.Join(root, "default"), other}},
		{name: "a root inside the skill store is left out", local: `{"host_root":"` + root + `","allowed_mount_roots":["` + root + `/skills/x"]}`, want: []string{}},
		{name: "default workspace outside the root", local: `{"host_root":"` + root + `","default_workspace":"` + other + `","allowed_mount_roots":["` + root + `"]}`, want: []string{}},
		{name: "roots clear of the store are kept", local: `{"host_root":"` + root + `","allowed_mount_roots":["` + other + `"]}`},
		{name: "no roots", local: `{"host_root":"` + root + `"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			patch := json.RawMessage(`{"backend":"docker","local":` + tc.local + `}`)
			out, notes := FitLangBotMountRoots(base, patch)
			if tc.want == nil {
				assert.Equal(t, string(patch), string(out))
				assert.Empty(t, notes)
				return
			}
			assert.NotEmpty(t, notes)
			var got struct {
				Backend string `json:"backend"`
				Local   struct {
					AllowedMountRoots []string `json:"allowed_mount_roots"`
					HostRoot          string   `json:"host_root"`
				} `json:"local"`
			}
			require.NoError(t, json.Unmarshal(out, &got))
			assert.Equal(t, "docker", got.Backend)
			assert.Equal(t, root, got.Local.HostRoot)
			assert.Equal(t, tc.want, got.Local.AllowedMountRoots)
			next, _, err := base.Merge(out, DecodeParams)
			require.NoError(t, err, "the fitted config is one boxrt accepts")
			assert.Equal(t, tc.want, []string(next.Local.AllowedMountRoots))
		})
	}
}

func TestRequestPlacement(t *testing.T) {
	trust := NewTrust("", true)
	tn := NewTenancy(New(nil, nil, Server{}), trust, TenancyOptions{})
	r, err := http.NewRequest("GET", "/", nil)
	require.NoError(t, err)
	r.Header.Set(HeaderInstanceID, "i")
	r.Header.Set(HeaderWorkspaceID, "w")
	r.Header.Set(HeaderPlacementGeneration, "2")
	_, ok := tn.RequestPlacement(r)
	assert.False(t, ok, "no instance is trusted yet: the default namespace")
	assert.True(t, trust.Matches("j"), "and the headers did not pin theirs")
	r.Header.Set(HeaderInstanceID, "j")
	p, ok := tn.RequestPlacement(r)
	require.True(t, ok)
	assert.Equal(t, tenant.Placement{Instance: "j", Workspace: "w", Generation: 2}, p)
	r.Header.Del(HeaderWorkspaceID)
	_, ok = tn.RequestPlacement(r)
	assert.False(t, ok, "incomplete headers: the default namespace")
}
