package test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readinessObject is grant-enforced mode's readiness object.
type readinessObject struct {
	Ready   bool   `json:"ready"`
	Mode    string `json:"mode"`
	Backend struct {
		Name           *string         `json:"name"`
		RuntimeBackend string          `json:"runtime_backend"`
		Available      bool            `json:"available"`
		Details        map[string]any  `json:"details"`
		Raw            json.RawMessage `json:"-"`
	} `json:"backend"`
	Checks                  map[string]bool `json:"checks"`
	UnsafeSoftStorageLimits bool            `json:"unsafe_soft_storage_limits"`
	Error                   string          `json:"error"`
}

// checkOrder is the reference's order of the 14 checks.
var checkOrder = []string{"configuration", "required_backend", "workspace_mount", "backend_available", "cgroup_v2",
	"namespace_isolation", "mount_isolation", "network_isolation", "hard_workspace_quota", "hard_skill_storage_quota",
	"bounded_ephemeral_storage", "inode_quota", "session_cap", "managed_process_cap"}

func (r readinessObject) failed() []string {
	var out []string
	for _, c := range checkOrder {
		if !r.Checks[c] {
			out = append(out, c)
		}
	}
	return out
}

// startAdmissionBox starts `boxrt box` (stdio, nsjail → bwrap) with
// admission on from LANGBOT_BOX_CONFIG; it returns the managed workspace
// root too.
func startAdmissionBox(t *testing.T, env ...string) (*lbProc, string) {
	ws := filepath.Join(t.TempDir(), "default")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	cfg := fmt.Sprintf(`{"enabled": true, "backend": "nsjail", "local": {"default_workspace": %q}, "admission": {"required": true}}`, ws)
	return startBox(t, lbOptions{Stdio: true, Config: cfg, Token: lbToken, Env: env}), ws
}

// backendReadiness reads the readiness of box_get_backend_info, which
// answers whether or not the runtime is ready.
func backendReadiness(t *testing.T, p *lbProc) readinessObject {
	t.Helper()
	var info struct {
		Name      *string         `json:"name"`
		Available bool            `json:"available"`
		Readiness readinessObject `json:"readiness"`
	}
	p.OK("box_get_backend_info", map[string]any{}, nil, &info)
	require.Equal(t, info.Readiness.Ready, info.Available, "available is readiness.ready")
	require.Equal(t, info.Readiness.Backend.Name, info.Name)
	return info.Readiness
}

func getReadyz(t *testing.T, addr string) (int, readinessObject) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var r readinessObject
	require.NoError(t, json.Unmarshal(body, &r), "%s", body)
	return resp.StatusCode, r
}

// The readiness probe is real: bwrap's throw-away sandbox proves the
// namespace, the /workspace bind mount and a network namespace of its own.
// Without the unsafe env, the storage checks bwrap cannot attest keep the
// runtime from serving managed sandboxes, and every sandbox operation and
// the relay say which checks failed.
func TestLangBotReadinessNotReady(t *testing.T) {
	p, ws := startAdmissionBox(t)
	r := backendReadiness(t, p)
	t.Logf("readiness on this machine: checks %v, details %v", r.Checks, r.Backend.Details)
	assert.Equal(t, "grant_enforced", r.Mode)
	assert.Len(t, r.Checks, 14)
	assert.False(t, r.Ready)
	assert.False(t, r.UnsafeSoftStorageLimits)
	require.NotNil(t, r.Backend.Name)
	assert.Equal(t, "nsjail", *r.Backend.Name, "bwrap stands in for nsjail")
	assert.Equal(t, "bwrap", r.Backend.RuntimeBackend)
	for _, c := range []string{"configuration", "required_backend", "workspace_mount", "backend_available",
		"namespace_isolation", "mount_isolation", "network_isolation", "session_cap", "managed_process_cap"} {
		assert.True(t, r.Checks[c], "%s: %+v", c, r)
	}
	// A managed session's workspace is a host_path, which bwrap's disk does
	// not bound, and skills are plain host directories.
	for _, c := range []string{"hard_workspace_quota", "hard_skill_storage_quota", "inode_quota"} {
		assert.False(t, r.Checks[c], c)
	}
	assert.Equal(t, r.Backend.Details["cgroup_limits_enforced"], r.Checks["cgroup_v2"])
	kernelV2 := fileExists("/sys/fs/cgroup/cgroup.controllers")
	assert.Equal(t, kernelV2, r.Backend.Details["cgroup_v2"], "details carry the kernel fact")
	entries, err := os.ReadDir(ws)
	require.NoError(t, err)
	assert.Empty(t, entries, "the probe cleans up its directory")

	want := "BoxReadinessError: Managed sandbox isolation is not ready (failed checks: " + strings.Join(r.failed(), ", ") + ")"
	w := tenant("notready", 1)
	for _, op := range []struct {
		action string
		data   map[string]any
	}{
		{"box_exec", map[string]any{"session_id": "x", "cmd": "true"}},
		{"box_create_session", map[string]any{"session_id": "x"}},
		{"box_get_session", map[string]any{"session_id": "global"}},
		{"box_get_sessions", map[string]any{}},
		{"box_delete_session", map[string]any{"session_id": "global"}},
		{"box_start_managed_process", map[string]any{"session_id": "global", "spec": map[string]any{"command": "true"}}},
		{"box_get_managed_process", map[string]any{"session_id": "global"}},
		{"box_stop_managed_process", map[string]any{"session_id": "global"}},
	} {
		res := p.Call(op.action, op.data, w)
		assert.Equal(t, want, res.Message, op.action)
		assert.Equal(t, "{}", string(res.Data), op.action)
	}
	p.Refused("box_health", map[string]any{}, nil, "BoxReadinessError: managed sandbox isolation is not ready")

	status, rz := getReadyz(t, p.Addr)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.False(t, rz.Ready)
	assert.Equal(t, r.Checks, rz.Checks)
	assert.Nil(t, rz.Backend.Details, "/readyz needs no token: no backend details")

	// The relay: the fence holds generation 1 (a tenant action passed it),
	// so the refusal is the readiness one, 400 with the reference's JSON.
	p.OK("box_status", map[string]any{}, w, nil)
	h := lbHeaders(lbInstance, lbToken)
	h.Set("X-LangBot-Workspace-Id", "notready")
	h.Set("X-LangBot-Placement-Generation", "1")
	req, err := http.NewRequest(http.MethodGet, "http://"+p.Addr+"/v1/sessions/"+workspaceNS("notready")+"-g1-global/managed-process/default/ws", nil)
	require.NoError(t, err)
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	var relayErr struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &relayErr), "%s", body)
	assert.Equal(t, "BoxReadinessError", relayErr.Error.Code)
	assert.Equal(t, strings.TrimPrefix(want, "BoxReadinessError: "), relayErr.Error.Message)

	// box_init clears the cache: the workspace root gone shows at once.
	require.NoError(t, os.RemoveAll(ws))
	p.OK("box_init", map[string]any{"admission": map[string]any{"required": true}}, nil, nil)
	r = backendReadiness(t, p)
	assert.False(t, r.Checks["workspace_mount"])
	assert.Contains(t, r.failed(), "workspace_mount")
}

// LANGBOT_BOX_ALLOW_UNSAFE_SOFT_STORAGE_LIMITS relaxes the four storage
// checks, and only them: with the real probe passing, the runtime is ready.
func TestLangBotReadinessUnsafeStorage(t *testing.T) {
	p, _ := startAdmissionBox(t, unsafeStorage)
	r := backendReadiness(t, p)
	assert.True(t, r.UnsafeSoftStorageLimits)
	for _, c := range []string{"hard_workspace_quota", "hard_skill_storage_quota", "bounded_ephemeral_storage", "inode_quota"} {
		assert.True(t, r.Checks[c], c)
	}
	// The env says nothing about isolation: those stay measured.
	assert.Equal(t, true, r.Backend.Details["namespace_isolation"])
	assert.Equal(t, true, r.Backend.Details["network_isolation"])
	assert.Equal(t, r.Backend.Details["hard_workspace_quota"], false, "details keep what the backend attests")
	require.True(t, r.Ready, "ready on real bwrap with the storage checks relaxed: %+v", r)
	// Logging is asynchronous (it never blocks the protocol): the line may
	// land after the answer.
	assert.Eventually(t, func() bool {
		return strings.Contains(p.stderr.String(), "LANGBOT_BOX_ALLOW_UNSAFE_SOFT_STORAGE_LIMITS")
	},
		10*time.Second, 10*time.Millisecond, "the relaxation is logged")

	var health readinessObject
	p.OK("box_health", map[string]any{}, nil, &health)
	assert.True(t, health.Ready)
	assert.Equal(t, "grant_enforced", health.Mode)
	assert.Len(t, health.Checks, 14)
	assert.True(t, health.Backend.Available)
	assert.NotEmpty(t, health.Backend.Details)

	status, rz := getReadyz(t, p.Addr)
	assert.Equal(t, http.StatusOK, status)
	assert.True(t, rz.Ready)
}

// A missing required key of an action's data is Python's KeyError with the
// quoted key, as the reference answers.
func TestLangBotKeyError(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	w := tenant("keys", 1)
	for _, c := range []struct {
		action string
		data   map[string]any
		want   string
	}{
		{"box_get_session", map[string]any{}, "KeyError: 'session_id'"},
		{"box_delete_session", map[string]any{}, "KeyError: 'session_id'"},
		{"box_get_managed_process", map[string]any{"process_id": "default"}, "KeyError: 'session_id'"},
		{"box_stop_managed_process", map[string]any{}, "KeyError: 'session_id'"},
		{"box_start_managed_process", map[string]any{"session_id": "s"}, "KeyError: 'spec'"},
		{"box_get_skill", map[string]any{}, "KeyError: 'name'"},
	} {
		res := p.Call(c.action, c.data, w)
		assert.Equal(t, 1, res.Code, c.action)
		assert.Equal(t, c.want, res.Message, c.action)
	}
}

// An action of a generation a newer one retires while it runs is cancelled
// and never answered, as in the reference.
func TestLangBotRetiredGenerationInFlight(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	p.OK("box_create_session", map[string]any{"session_id": "slow"}, tenant("inflight", 1), nil)
	// A sleep of a length nothing else uses, to find it in /proc.
	_, old := p.Go("box_exec", map[string]any{"session_id": "slow", "cmd": "sleep 61.4142"}, tenant("inflight", 1))
	// Wait until the exec runs, then move the Workspace to generation 2.
	require.Eventually(t, func() bool { return processRunning("sleep\x0061.4142") }, time.Minute, 50*time.Millisecond)
	var sessions struct {
		Sessions []any `json:"sessions"`
	}
	p.OK("box_get_sessions", map[string]any{}, tenant("inflight", 2), &sessions)
	assert.Empty(t, sessions.Sessions)
	require.Eventually(t, func() bool {
		return strings.Contains(p.stderr.String(), "request cancelled without a reply")
	}, time.Minute, 50*time.Millisecond, "the old generation's exec is cancelled")
	select {
	case r := <-old:
		t.Fatalf("the retired exec was answered: %s", r.Raw)
	default:
	}
	// The connection keeps serving.
	p.OK("__ping", map[string]any{}, nil, nil)
}

// processRunning reports whether a process with that command line (NUL
// separated) runs.
func processRunning(cmdline string) bool {
	matches, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, m := range matches {
		if b, err := os.ReadFile(m); err == nil && strings.TrimRight(string(b), "\x00") == cmdline {
			return true
		}
	}
	return false
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
