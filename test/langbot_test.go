package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostBoxConfig is a LangBot host's whole box: section as it sends it in
// LANGBOT_BOX_CONFIG and box_init (minus runtime): host-only keys boxrt
// ignores, and nsjail, which boxrt runs as bwrap.
const hostBoxConfig = `{"enabled": true, "backend": "nsjail", "profile": "default", "allowed_host_mount_roots": [], "default_host_workspace": "", "limits": {"max_sessions": 16}}`

// workspaceNS is the reference's namespace of (instance-a, workspace).
func workspaceNS(workspace string) string {
	sum := sha256.Sum256([]byte(lbInstance + "\x00" + workspace))
	return "ws-" + hex.EncodeToString(sum[:])[:24]
}

func TestLangBotEnvelopeStdio(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	// The host's handshake: __ping, then box_init with its box: section.
	r := p.Call("__ping", map[string]any{}, nil)
	assert.Equal(t, fmt.Sprintf(`{"seq_id":%s,"code":0,"message":"success","data":{},"chunk_status":"continue"}`, r.SeqID), string(r.Raw))
	r = p.Call("box_init", json.RawMessage(hostBoxConfig), nil)
	assert.Equal(t, fmt.Sprintf(`{"seq_id":%s,"code":0,"message":"success","data":{"initialized":true},"chunk_status":"continue"}`, r.SeqID), string(r.Raw))

	var info map[string]any
	p.OK("box_get_backend_info", map[string]any{}, nil, &info)
	assert.Equal(t, "bwrap", info["name"])
	assert.Equal(t, true, info["available"])
	assert.Equal(t, "nsjail", info["requested_backend"], "backend info says nsjail runs as bwrap")

	tests := []struct {
		name   string
		action string
		data   any
		ctx    *lbContext
		prefix string
	}{
		{name: "unknown action", action: "__heartbeat", data: map[string]any{}, prefix: "ValueError: Action __heartbeat not found"},
		{name: "unknown action with a context", action: "box_nope", data: map[string]any{}, ctx: tenant("w", 1), prefix: "ValueError: Action box_nope not found"},
		{name: "tenant action without context", action: "box_status", data: map[string]any{}, prefix: "PermissionError: Box tenant action requires a trusted Workspace context"},
		{name: "sandbox action without context", action: "box_exec", data: map[string]any{"session_id": "s", "cmd": "true"}, prefix: "PermissionError: Box tenant action requires a trusted Workspace context"},
		{name: "skill action without context", action: "box_list_skills", data: map[string]any{}, prefix: "PermissionError: Box tenant action requires a trusted Workspace context"},
		{name: "context of another instance", action: "box_status", data: map[string]any{},
			ctx: &lbContext{InstanceUUID: "intruder", WorkspaceUUID: "w", PlacementGeneration: 1}, prefix: "PermissionError: Box action context does not match the trusted instance"},
		{name: "host-control action with another instance", action: "box_health", data: map[string]any{},
			ctx: &lbContext{InstanceUUID: "intruder", WorkspaceUUID: "w", PlacementGeneration: 1}, prefix: "PermissionError: Box action context does not match the trusted instance"},
		{name: "bad spec", action: "box_exec", data: map[string]any{"cmd": "true"}, ctx: tenant("w", 1), prefix: "BoxValidationError: "},
		{name: "unknown session", action: "box_get_session", data: map[string]any{"session_id": "nope"}, ctx: tenant("w", 1), prefix: "BoxSessionNotFoundError: "},
		{name: "admission not enabled", action: "box_upsert_sandbox_admission_grant", data: map[string]any{"instance_uuid": lbInstance, "workspace_uuid": "w",
			"execution_generation": 1, "entitlement_revision": 1, "expires_at": time.Now().Add(time.Minute).UTC().Format(time.RFC3339), "max_sessions": 1, "max_managed_processes": 0},
			prefix: "BoxAdmissionError: Sandbox admission enforcement is not enabled"},
		{name: "probe name", action: "box_verify_shared_workspace", data: map[string]any{"marker_name": "../etc/passwd"}, prefix: "BoxReadinessError: Invalid Box shared Workspace probe basename"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p.Refused(tc.action, tc.data, tc.ctx, tc.prefix)
		})
	}

	t.Run("invalid envelopes", func(t *testing.T) {
		for _, tc := range []struct{ line, want string }{
			{`{"seq_id": 900001, "action": "__ping"}`, `{"seq_id":900001,"code":1,"message":"ValidationError: data: Input should be a valid dictionary","data":{},"chunk_status":"continue"}`},
			{`{"seq_id": 900002, "action": "__ping", "data": [], "context": null}`, `{"seq_id":900002,"code":1,"message":"ValidationError: data: Input should be a valid dictionary","data":{},"chunk_status":"continue"}`},
			{`{"seq_id": 900003, "action": "__ping", "data": {}, "context": {"instance_uuid": "instance-a", "workspace_uuid": "w", "extra": 1}}`,
				`{"seq_id":900003,"code":1,"message":"ValidationError: context: extra: Extra inputs are not permitted","data":{},"chunk_status":"continue"}`},
			{`{"action": "__ping", "data": {}}`, `{"seq_id":-1,"code":1,"message":"ValidationError: seq_id: Input should be a valid integer","data":{},"chunk_status":"continue"}`},
		} {
			p.Raw(tc.line + "\n")
			select {
			case r := <-p.stray:
				assert.Equal(t, tc.want, string(r.Raw))
			case <-time.After(10 * time.Second):
				t.Fatalf("no answer to %s", tc.line)
			}
		}
	})

	t.Run("skipped lines get no answer", func(t *testing.T) {
		p.Raw("a stray print\n\n   \n[1,2]\n{not json}\n" +
			`{"seq_id": 5, "code": 0, "message": "success", "data": {}, "action": "__ping"}` + "\n" +
			`{"type": "chunk_data", "data": "x", "offset": 0}` + "\n" + `{"seq_id": 6}` + "\n")
		r := p.Call("__ping", map[string]any{}, nil)
		assert.Equal(t, 0, r.Code)
		select {
		case s := <-p.stray:
			t.Fatalf("a skipped line was answered: %s", s.Raw)
		case <-time.After(200 * time.Millisecond):
		}
	})
}

func TestLangBotStdioChunking(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	ctx := tenant("chunks", 1)
	tests := []struct {
		name string
		// cmd prints want (the output is checked whole).
		cmd  string
		want string
		// chunked: the answer must have come in chunk lines.
		chunked bool
	}{
		{name: "small answer is one line", cmd: "printf small", want: "small"},
		{name: "html-heavy output stays under the line limit", cmd: `head -c 300000 /dev/zero | tr '\0' '<'`, want: strings.Repeat("<", 300000), chunked: true},
		{name: "quotes double at most", cmd: `head -c 200000 /dev/zero | tr '\0' '"'`, want: strings.Repeat(`"`, 200000), chunked: true},
		{name: "multi-byte characters are never split", cmd: `i=0; while [ $i -lt 9000 ]; do printf 'é€😀'; i=$((i+1)); done`, want: strings.Repeat("é€😀", 9000), chunked: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := p.Call("box_exec", map[string]any{"session_id": "c", "cmd": tc.cmd, "timeout_sec": 60}, ctx)
			require.Equal(t, 0, r.Code, r.Message)
			var res struct {
				Stdout string `json:"stdout"`
			}
			require.NoError(t, json.Unmarshal(r.Data, &res))
			assert.Equal(t, tc.want, res.Stdout, "output is not stripped or altered")
			assert.Equal(t, tc.chunked, r.Lines > 1, "lines: %d, message: %d bytes", r.Lines, len(r.Raw))
		})
	}

	t.Run("chunked request is reassembled", func(t *testing.T) {
		// The host chunks large box_exec commands the same way.
		payload := strings.Repeat("x", 50000) + "é"
		msg := request(777001, "box_exec", map[string]any{"session_id": "c", "cmd": "printf %s '" + payload + "' | wc -c"}, ctx)
		var lines strings.Builder
		fmt.Fprintf(&lines, `{"type": "chunk_start", "total_size": %d}`+"\n", len(msg))
		for off := 0; off < len(msg); {
			end := min(off+16384, len(msg))
			for end < len(msg) && msg[end]&0xC0 == 0x80 {
				end--
			}
			piece, _ := json.Marshal(string(msg[off:end]))
			fmt.Fprintf(&lines, `{"type": "chunk_data", "data": %s, "offset": %d}`+"\n", piece, off)
			off = end
		}
		lines.WriteString(`{"type": "chunk_end"}` + "\n")
		p.Raw(lines.String())
		select {
		case r := <-p.stray:
			require.Equal(t, "777001", string(r.SeqID))
			require.Equal(t, 0, r.Code, r.Message)
			var res struct {
				Stdout string `json:"stdout"`
			}
			require.NoError(t, json.Unmarshal(r.Data, &res))
			assert.Equal(t, fmt.Sprint(len(payload)), strings.TrimSpace(res.Stdout))
		case <-time.After(time.Minute):
			t.Fatal("no answer to the chunked request")
		}
	})
	p.checkFraming()
}

// TestLangBotQueuedActions queues 128 execs behind one slow exec of the
// same session, past the 128 that run at once on a connection: another
// action is not refused but answered while they wait, out of order, and
// the queued ones all complete.
func TestLangBotQueuedActions(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	ctx := tenant("busy", 1)
	p.OK("box_create_session", map[string]any{"session_id": "q"}, ctx, nil)
	first, slow := p.Go("box_exec", map[string]any{"session_id": "q", "cmd": "sleep 4.0271"}, ctx)
	// The slow exec must hold the session before the others queue behind
	// it.
	require.Eventually(t, func() bool { return processRunning("sleep\x004.0271") }, time.Minute, 10*time.Millisecond,
		"the slow exec never started")
	queued := make([]chan lbResponse, 0, 128)
	for range 128 {
		_, ch := p.Go("box_exec", map[string]any{"session_id": "q", "cmd": "true"}, ctx)
		queued = append(queued, ch)
	}
	statusSeq, status := p.Go("box_status", map[string]any{}, ctx)
	r := p.wait("box_status", status, 10*time.Second)
	require.Equal(t, 0, r.Code, r.Message)
	r = p.wait("box_exec", slow, time.Minute)
	require.Equal(t, 0, r.Code, r.Message)
	for _, ch := range queued {
		r := p.wait("box_exec", ch, 2*time.Minute)
		require.Equal(t, 0, r.Code, r.Message)
	}
	p.mu.Lock()
	order := append([]string(nil), p.order...)
	p.mu.Unlock()
	assert.Less(t, indexOf(order, fmt.Sprint(statusSeq)), indexOf(order, fmt.Sprint(first)), "box_status overtakes the slow exec: answers go out of order")
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// referenceExec is the reference's literal box_exec request (SDK spec
// §1.9): the full BoxSpec as the host dumps it, Docker image included.
const referenceExec = `{"seq_id": 48213, "action": "box_exec", "data": {"cmd": "echo hi", "workdir": "/workspace", "timeout_sec": 30, "network": "off", "session_id": "s1", "env": {}, "image": "rockchin/langbot-sandbox:latest", "host_path": null, "host_path_mode": "rw", "mount_path": "/workspace", "extra_mounts": [], "skill_name": null, "persistent": false, "cpus": 1.0, "memory_mb": 512, "pids_limit": 128, "read_only_rootfs": true, "workspace_quota_mb": 0}, "context": {"instance_uuid": "instance-a", "workspace_uuid": "workspace-a", "placement_generation": 1}}`

func TestLangBotTenancy(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	t.Run("the reference's literal exec", func(t *testing.T) {
		// nsjail runs as bwrap, which ignores the Docker image as nsjail does.
		p.Raw(referenceExec + "\n")
		select {
		case r := <-p.stray:
			require.Equal(t, "48213", string(r.SeqID))
			require.Equal(t, 0, r.Code, r.Message)
			var res map[string]any
			require.NoError(t, json.Unmarshal(r.Data, &res))
			assert.Equal(t, "s1", res["session_id"])
			assert.Equal(t, "hi\n", res["stdout"])
			assert.Equal(t, "completed", res["status"])
		case <-time.After(time.Minute):
			t.Fatal("no answer")
		}
	})
	a1, b1 := tenant("workspace-a", 1), tenant("workspace-b", 1)
	// The host's id for a conversation scope: 71 characters, so the
	// physical id is over 100.
	sum := sha256.Sum256([]byte("pipeline:1/conversation:2"))
	long := "lb-box-" + hex.EncodeToString(sum[:])
	require.Len(t, long, 71)

	for _, id := range []string{long, "s1", "my session/1"} {
		var res map[string]any
		p.OK("box_exec", map[string]any{"session_id": id, "cmd": "echo hi"}, a1, &res)
		want := strings.Trim(strings.NewReplacer(" ", "-", "/", "-").Replace(id), "-")
		assert.Equal(t, want, res["session_id"], "answers carry the logical id")
		assert.Equal(t, "hi\n", res["stdout"], "output is not stripped (boxrt keeps the trailing newline)")
	}
	var info map[string]any
	p.OK("box_get_session", map[string]any{"session_id": long}, a1, &info)
	assert.Equal(t, long, info["session_id"])
	phys := workspaceNS("workspace-a") + "-g1-" + long
	assert.Greater(t, len(phys), 100, "physical ids of the host's ids are over 100 characters")

	listed := func(ctx *lbContext) []string {
		var l struct {
			Sessions []map[string]any `json:"sessions"`
		}
		p.OK("box_get_sessions", map[string]any{}, ctx, &l)
		var ids []string
		for _, s := range l.Sessions {
			ids = append(ids, s["session_id"].(string))
		}
		return ids
	}
	assert.ElementsMatch(t, []string{long, "s1", "my-session-1"}, listed(a1))
	assert.Empty(t, listed(b1), "another Workspace sees none of them")
	p.Refused("box_get_session", map[string]any{"session_id": "s1"}, b1, "BoxSessionNotFoundError: ")

	var st map[string]any
	p.OK("box_status", map[string]any{}, a1, &st)
	assert.Equal(t, float64(3), st["active_sessions"], "status counts the caller's placement")

	// A process of workspace-a at generation 1, then the generation
	// advances: the old generation's sessions go, and the stale
	// generation is refused.
	p.OK("box_start_managed_process", map[string]any{"session_id": "s1", "spec": map[string]any{"command": "sleep", "args": []string{"300"}}}, a1, &info)
	assert.Equal(t, "s1", info["session_id"])
	a2 := tenant("workspace-a", 2)
	assert.Empty(t, listed(a2), "generation 2 retired generation 1's sessions")
	p.Refused("box_get_sessions", map[string]any{}, a1, "PermissionError: Stale Box placement generation")
	p.Refused("box_exec", map[string]any{"session_id": "s1", "cmd": "true"}, a1, "PermissionError: Stale Box placement generation")
	assert.Empty(t, listed(b1), "workspace-b is fenced on its own")

	var del map[string]any
	p.OK("box_exec", map[string]any{"session_id": " d 1 ", "cmd": "true"}, a2, nil)
	p.OK("box_delete_session", map[string]any{"session_id": " d 1 "}, a2, &del)
	assert.Equal(t, " d 1 ", del["deleted"], "deleted is the session id exactly as sent")

	var sa map[string]any
	p.OK("box_exec", map[string]any{"session_id": "st", "cmd": "head -c 10000 /dev/zero > /workspace/f"}, a2, nil)
	p.OK("box_get_storage_analysis", map[string]any{}, a2, &sa)
	var keys []string
	dirs := map[string]map[string]any{}
	for _, d := range sa["directories"].([]any) {
		m := d.(map[string]any)
		keys = append(keys, m["key"].(string))
		dirs[m["key"].(string)] = m
	}
	assert.Equal(t, []string{"workspace", "mcp", "inbox", "outbox", "skills", "session_workspaces", "session_caches", "session_temp", "managed_process_workspaces"}, keys)
	assert.Equal(t, "sandbox_sessions", dirs["session_workspaces"]["scope"])
	assert.GreaterOrEqual(t, dirs["session_workspaces"]["size_bytes"], float64(10000))
	assert.Equal(t, float64(1), sa["active_sessions"])
	for _, k := range []string{"size_bytes", "directories", "active_sessions", "managed_processes"} {
		assert.Contains(t, sa, k)
	}
}

// TestLangBotAdmission runs the grant-enforced mode: admission is turned
// on by box_init and cannot be turned off.
func TestLangBotAdmission(t *testing.T) {
	// A ready configuration on real bwrap: a managed workspace root, and
	// the storage checks bwrap cannot attest relaxed as the reference
	// allows.
	p := startBox(t, lbOptions{Stdio: true, Config: admissionBoxConfig(t), Token: lbToken, Env: []string{unsafeStorage}})
	p.OK("box_init", map[string]any{"admission": map[string]any{"required": true, "max_grant_ttl_sec": 600}}, nil, nil)
	exp := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339) }
	grant := func(ws string, gen, rev int64, sessions, procs int, expires string) map[string]any {
		return map[string]any{"instance_uuid": lbInstance, "workspace_uuid": ws, "execution_generation": gen,
			"entitlement_revision": rev, "expires_at": expires, "max_sessions": sessions, "max_managed_processes": procs}
	}
	w := tenant("adm", 1)
	steps := []struct {
		name   string
		action string
		data   any
		ctx    *lbContext
		prefix string // "" for success
	}{
		{"no grant yet", "box_exec", map[string]any{"session_id": "x", "cmd": "true"}, w, "BoxAdmissionError: Sandbox admission grant is missing"},
		{"expired grant", "box_upsert_sandbox_admission_grant", grant("adm", 1, 1, 1, 0, exp(-time.Minute)), nil, "BoxAdmissionError: Cannot install an expired sandbox admission grant"},
		{"too long", "box_upsert_sandbox_admission_grant", grant("adm", 1, 1, 1, 0, exp(time.Hour)), nil, "BoxAdmissionError: Sandbox admission grant lifetime exceeds the configured maximum"},
		{"over the session cap", "box_upsert_sandbox_admission_grant", grant("adm", 1, 1, 2, 0, exp(time.Minute)), nil, "BoxAdmissionError: Sandbox admission grant exceeds the session cap"},
		{"over the process cap", "box_upsert_sandbox_admission_grant", grant("adm", 1, 1, 1, 1, exp(time.Minute)), nil, "BoxAdmissionError: Sandbox admission grant exceeds the managed-process cap"},
		{"naive expiry", "box_upsert_sandbox_admission_grant", grant("adm", 1, 1, 1, 0, "2030-01-01T00:00:00"), nil, "BoxValidationError: expires_at must"},
		{"boolean limit", "box_upsert_sandbox_admission_grant", map[string]any{"instance_uuid": lbInstance, "workspace_uuid": "adm", "execution_generation": 1,
			"entitlement_revision": 1, "expires_at": exp(time.Minute), "max_sessions": true, "max_managed_processes": 0}, nil, "BoxValidationError: "},
		{"other instance", "box_upsert_sandbox_admission_grant", map[string]any{"instance_uuid": "intruder", "workspace_uuid": "adm", "execution_generation": 1,
			"entitlement_revision": 1, "expires_at": exp(time.Minute), "max_sessions": 1, "max_managed_processes": 0}, nil, "PermissionError: Sandbox admission grant does not match the trusted instance"},
		{"install", "box_upsert_sandbox_admission_grant", grant("adm", 1, 2, 1, 0, exp(time.Minute)), nil, ""},
		{"same revision, other limits", "box_upsert_sandbox_admission_grant", grant("adm", 1, 2, 0, 0, exp(time.Minute)), nil, "BoxAdmissionError: Sandbox admission limits changed without a new entitlement revision"},
		{"stale revision", "box_upsert_sandbox_admission_grant", grant("adm", 1, 1, 1, 0, exp(time.Minute)), nil, "BoxAdmissionError: Sandbox admission grant revision is stale"},
		{"network is off", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "network": "on"}, w, "BoxAdmissionError: Managed sandbox network access is disabled"},
		{"no extra mounts", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "extra_mounts": []any{map[string]any{"host_path": "/tmp", "mount_path": "/x"}}}, w, "BoxAdmissionError: Managed sandbox additional host mounts are disabled"},
		{"mount path", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "mount_path": "/data"}, w, "BoxAdmissionError: Managed sandbox mount_path is runtime-owned"},
		{"workdir", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "workdir": "/etc"}, w, "BoxAdmissionError: Managed sandbox workdir must stay under /workspace"},
		{"host path", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "host_path": "/etc"}, w, "BoxAdmissionError: Managed sandbox host_path is runtime-owned"},
		{"exec uses the canonical session", "box_exec", map[string]any{"session_id": "anything", "cmd": "true", "image": "rockchin/langbot-sandbox:latest", "timeout_sec": 9999}, w, ""},
		{"session id is runtime-owned", "box_get_session", map[string]any{"session_id": "anything"}, w, "BoxAdmissionError: Managed sandbox session_id is runtime-owned"},
		{"canonical session", "box_get_session", map[string]any{"session_id": "global"}, w, ""},
		{"no managed processes", "box_start_managed_process", map[string]any{"session_id": "global", "spec": map[string]any{"command": "true"}}, w, "BoxAdmissionError: Sandbox admission grant does not permit managed processes"},
		{"other generation", "box_exec", map[string]any{"session_id": "x", "cmd": "true"}, tenant("adm", 2), "BoxAdmissionError: Sandbox admission grant belongs to another execution generation"},
		{"stale revocation", "box_revoke_sandbox_admission_grant", map[string]any{"instance_uuid": lbInstance, "workspace_uuid": "adm", "entitlement_revision": 1}, nil, "BoxAdmissionError: Sandbox admission revocation is stale"},
		{"revoke", "box_revoke_sandbox_admission_grant", map[string]any{"instance_uuid": lbInstance, "workspace_uuid": "adm", "entitlement_revision": 3}, nil, ""},
		{"revoked", "box_exec", map[string]any{"session_id": "x", "cmd": "true"}, w, "BoxAdmissionError: Sandbox admission grant is missing"},
		{"revision revoked", "box_upsert_sandbox_admission_grant", grant("adm", 1, 3, 1, 0, exp(time.Minute)), nil, "BoxAdmissionError: Sandbox admission grant revision was revoked"},
		{"cannot be turned off", "box_init", map[string]any{"admission": map[string]any{"required": false}}, nil, ""},
		{"turned off is refused", "box_upsert_sandbox_admission_grant", grant("adm", 1, 4, 1, 0, exp(time.Minute)), nil, "BoxReadinessError: Invalid sandbox admission configuration: Sandbox admission enforcement cannot be disabled"},
	}
	for _, s := range steps {
		if s.prefix != "" {
			p.Refused(s.action, s.data, s.ctx, s.prefix)
			continue
		}
		var res map[string]any
		p.OK(s.action, s.data, s.ctx, &res)
		switch s.name {
		case "install":
			assert.Equal(t, true, res["installed"])
			assert.Equal(t, float64(2), res["entitlement_revision"])
			assert.True(t, strings.HasSuffix(res["expires_at"].(string), "+00:00"), "expires_at is isoformat: %v", res["expires_at"])
		case "exec uses the canonical session":
			assert.Equal(t, "global", res["session_id"], s.name)
		case "canonical session":
			assert.Equal(t, "global", res["session_id"])
			assert.Equal(t, true, res["persistent"], "the policy's spec: %v", res)
			assert.Equal(t, "off", res["network"])
			assert.Equal(t, float64(512), res["memory_mb"])
		case "revoke":
			assert.Equal(t, map[string]any{"revoked": true, "workspace_uuid": "adm", "entitlement_revision": float64(3)}, res)
		}
	}
}

// TestLangBotAdmissionErrorOrder: over the wire, admission reads a sandbox
// action's params as the method decodes them and refuses before their own
// errors are reported; what it does not refuse is then validated.
func TestLangBotAdmissionErrorOrder(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: admissionBoxConfig(t), Token: lbToken, Env: []string{unsafeStorage}})
	p.OK("box_init", map[string]any{"admission": map[string]any{"required": true, "max_grant_ttl_sec": 600}}, nil, nil)
	p.OK("box_upsert_sandbox_admission_grant", map[string]any{"instance_uuid": lbInstance, "workspace_uuid": "order", "execution_generation": 1,
		"entitlement_revision": 1, "expires_at": time.Now().Add(time.Minute).UTC().Format(time.RFC3339), "max_sessions": 1, "max_managed_processes": 0}, nil, nil)
	w := tenant("order", 1)
	for _, s := range []struct {
		name, action string
		data         map[string]any
		prefix       string
	}{
		{"network on before an unknown member", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "network": "on", "bogus": 1}, "BoxAdmissionError: Managed sandbox network access is disabled"},
		{"network on before a wrong type", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "cpus": "many", "network": "on"}, "BoxAdmissionError: Managed sandbox network access is disabled"},
		{"a member named in another case", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "Mount_Path": "/etc"}, "BoxAdmissionError: Managed sandbox mount_path is runtime-owned"},
		{"session id before an unknown member", "box_get_session", map[string]any{"session_id": "other", "bogus": 1}, "BoxAdmissionError: Managed sandbox session_id is runtime-owned"},
		{"from_snapshot on a method without it", "box_suspend_session", map[string]any{"session_id": "global", "from_snapshot": "s"}, "BoxAdmissionError: Managed sandbox cannot be restored from a snapshot"},
		{"then the params' own error", "box_exec", map[string]any{"session_id": "x", "cmd": "true", "bogus": 1}, "BoxValidationError: unknown field"},
	} {
		p.Refused(s.action, s.data, w, s.prefix)
	}
	// Members the policy replaces are not validated as sent.
	var res map[string]any
	p.OK("box_exec", map[string]any{"session_id": "", "cmd": "echo ok", "memory_mb": 1, "timeout_sec": 0}, w, &res)
	assert.Equal(t, "global", res["session_id"])
	assert.Equal(t, "ok\n", res["stdout"])
}

// unsafeStorage relaxes the four storage readiness checks.
const unsafeStorage = "LANGBOT_BOX_ALLOW_UNSAFE_SOFT_STORAGE_LIMITS=1"

// admissionBoxConfig is the host's box: section with nsjail (bwrap) and a
// managed workspace root of the test's own.
func admissionBoxConfig(t *testing.T) string {
	ws := filepath.Join(t.TempDir(), "default")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	return fmt.Sprintf(`{"enabled": true, "backend": "nsjail", "profile": "default", "limits": {"max_sessions": 16}, "local": {"default_workspace": %q}}`, ws)
}

func TestLangBotSharedWorkspaceProbe(t *testing.T) {
	root := t.TempDir()
	ws := filepath.Join(root, "default")
	require.NoError(t, os.MkdirAll(ws, 0o755))
	cfg := fmt.Sprintf(`{"backend":"nsjail","local":{"default_workspace":%q}}`, ws)
	p := startBox(t, lbOptions{Stdio: true, Config: cfg, Token: lbToken})
	name := ".langbot-box-volume-probe-" + strings.Repeat("ab", 16)
	content := []byte("marker written by core")
	require.NoError(t, os.WriteFile(filepath.Join(ws, name), content, 0o644))
	var res map[string]any
	p.OK("box_verify_shared_workspace", map[string]any{"marker_name": name}, nil, &res)
	sum := sha256.Sum256(content)
	assert.Equal(t, map[string]any{"marker_name": name, "sha256": hex.EncodeToString(sum[:]), "size": float64(len(content))}, res)

	link := ".langbot-box-volume-probe-" + strings.Repeat("cd", 16)
	require.NoError(t, os.Symlink("/etc/hostname", filepath.Join(ws, link)))
	p.Refused("box_verify_shared_workspace", map[string]any{"marker_name": link}, nil, "BoxReadinessError: Box shared Workspace probe is not a regular file")
	missing := ".langbot-box-volume-probe-" + strings.Repeat("ef", 16)
	p.Refused("box_verify_shared_workspace", map[string]any{"marker_name": missing}, nil, "BoxReadinessError: Box Runtime cannot read the Core shared Workspace probe")
}

// TestLangBotE2BBackend: the host's box.backend e2b runs its sessions on
// an E2B endpoint (a second boxrt serving E2B's API).
func TestLangBotE2BBackend(t *testing.T) {
	endpoint := e2bEndpoint(t)
	p := startBox(t, lbOptions{Stdio: true, Config: `{"backend":"e2b","e2b":` + e2bBackendConfig(endpoint) + `}`, Token: lbToken})
	p.OK("box_init", map[string]any{"backend": "e2b", "e2b": json.RawMessage(e2bBackendConfig(endpoint))}, nil, nil)
	var info map[string]any
	p.OK("box_get_backend_info", map[string]any{}, nil, &info)
	assert.Equal(t, "e2b", info["name"])
	assert.Equal(t, true, info["available"], "%v", info)
	var res map[string]any
	p.OK("box_exec", map[string]any{"session_id": "s", "cmd": "echo on e2b; pwd"}, tenant("w", 1), &res)
	assert.Equal(t, "on e2b\n/workspace\n", res["stdout"], "%v", res)
	p.OK("box_delete_session", map[string]any{"session_id": "s"}, tenant("w", 1), nil)
}

func TestLangBotWebSocket(t *testing.T) {
	p := startBox(t, lbOptions{Config: hostBoxConfig, Token: lbToken, Env: []string{"LANGBOT_BOX_TRUSTED_INSTANCE_UUID="}})
	for _, tc := range []struct {
		name string
		h    http.Header
	}{
		{"no headers", http.Header{}},
		{"no instance", lbHeaders("", lbToken)},
		{"wrong token", lbHeaders(lbInstance, strings.Repeat("x", 40))},
		{"bad instance id", lbHeaders("bad instance!", lbToken)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, status := dialBox(t, p.Addr, tc.h)
			assert.Equal(t, http.StatusUnauthorized, status)
		})
	}
	c, status := dialBox(t, p.Addr, lbHeaders(lbInstance, lbToken))
	require.Equal(t, http.StatusSwitchingProtocols, status)
	_, status = dialBox(t, p.Addr, lbHeaders("instance-b", lbToken))
	assert.Equal(t, http.StatusUnauthorized, status, "the first connection pinned instance-a")

	r := c.Call("__ping", map[string]any{}, nil)
	assert.Equal(t, fmt.Sprintf(`{"seq_id":%s,"code":0,"message":"success","data":{},"chunk_status":"continue"}`, r.SeqID), string(r.Raw))
	c.OK("box_init", json.RawMessage(hostBoxConfig), nil, nil)
	// A large answer is one text message, never chunk lines.
	r = c.Call("box_exec", map[string]any{"session_id": "w", "cmd": `head -c 100000 /dev/zero | tr '\0' 'a'`}, tenant("w", 1))
	require.Equal(t, 0, r.Code, r.Message)
	assert.Equal(t, 1, r.Lines)
	assert.Greater(t, len(r.Raw), 100000)
	c.Refused("box_status", map[string]any{}, nil, "PermissionError: Box tenant action requires a trusted Workspace context")
	c.checkFraming()
}

// TestLangBotRelayMCP carries a real MCP session through the relay the way
// the host's mcp_stdio loader reaches it: physical session id in the path,
// the X-LangBot-* headers, subprotocol mcp.
func TestLangBotRelayMCP(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.Chmod(root, 0o755))
	build := exec.Command("go", "build", "-o", filepath.Join(root, "mcpserver"), "./fixtures/mcpserver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	cfg := fmt.Sprintf(`{"backend":"nsjail","local":{"allowed_mount_roots":[%q]}}`, root)
	p := startBox(t, lbOptions{Stdio: true, Config: cfg, Token: lbToken})
	ctx := tenant("mcp-ws", 3)
	p.OK("box_create_session", map[string]any{"session_id": "mcp server", "host_path": root}, ctx, nil)
	var info map[string]any
	p.OK("box_start_managed_process", map[string]any{"session_id": "mcp server", "spec": map[string]any{"command": "/workspace/mcpserver"}}, ctx, &info)
	assert.Equal(t, "mcp-server", info["session_id"], "the sanitised logical id, as the reference answers")
	physical := workspaceNS("mcp-ws") + "-g3-mcp-server"

	dial := func(path string, h http.Header) (*websocket.Conn, int) {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(dctx, "ws://"+p.Addr+path, &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{"mcp"}})
		if err != nil {
			require.NotNil(t, resp, "%v", err)
			resp.Body.Close()
			return nil, resp.StatusCode
		}
		assert.Equal(t, "mcp", c.Subprotocol())
		t.Cleanup(func() { c.CloseNow() })
		return c, http.StatusSwitchingProtocols
	}
	relayHeaders := func(workspace, gen, token string) http.Header {
		h := lbHeaders(lbInstance, token)
		h.Set("X-LangBot-Workspace-Id", workspace)
		h.Set("X-LangBot-Placement-Generation", gen)
		return h
	}
	legacy := "/v1/sessions/" + physical + "/managed-process/ws"
	for _, tc := range []struct {
		name string
		path string
		h    http.Header
	}{
		{"logical id in the path", "/v1/sessions/mcp%20server/managed-process/default/ws", relayHeaders("mcp-ws", "3", lbToken)},
		{"generation the fence does not hold", legacy, relayHeaders("mcp-ws", "2", lbToken)},
		{"non-canonical generation", legacy, relayHeaders("mcp-ws", "03", lbToken)},
		{"other workspace", legacy, relayHeaders("other", "3", lbToken)},
		{"no token", legacy, relayHeaders("mcp-ws", "3", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, status := dial(tc.path, tc.h)
			assert.Equal(t, http.StatusUnauthorized, status)
		})
	}

	c, status := dial(legacy, relayHeaders("mcp-ws", "3", lbToken))
	require.Equal(t, http.StatusSwitchingProtocols, status)
	mctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := mcpAdd(mctx, t, c)
	defer cs.Close()

	// A new placement generation retires the session: its relay ends.
	p.OK("box_get_sessions", map[string]any{}, tenant("mcp-ws", 4), nil)
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	for {
		if _, _, err := c.Read(rctx); err != nil {
			require.NoError(t, rctx.Err(), "the relay of a retired generation did not close")
			break
		}
	}
}

func TestLangBotHostBackend(t *testing.T) {
	t.Run("stdio runs commands unsandboxed with a minimal environment", func(t *testing.T) {
		p := startBox(t, lbOptions{Stdio: true, Config: `{"backend":"host"}`, Token: lbToken})
		var info map[string]any
		p.OK("box_get_backend_info", map[string]any{}, nil, &info)
		assert.Equal(t, "host", info["name"])
		assert.Equal(t, true, info["unsafe_direct_execution"])
		var res map[string]any
		p.OK("box_exec", map[string]any{"session_id": "h", "cmd": `echo "token=[$LANGBOT_BOX_CONTROL_TOKEN]"; cd /workspace 2>/dev/null || echo "no /workspace on the host path"; echo "$LANGBOT_BOX_WORKSPACE" | grep -c /host/`}, tenant("w", 1), &res)
		assert.Equal(t, "token=[]\nno /workspace on the host path\n1\n", res["stdout"], "the token never leaks; only workdir and cwd are rewritten: %v", res)
		r := p.Call("box_exec", map[string]any{"session_id": "h", "cmd": "sleep 30", "timeout_sec": 1}, tenant("w", 1))
		require.Equal(t, 0, r.Code, r.Message)
		assert.Contains(t, string(r.Data), `"status":"timed_out"`)
	})
	t.Run("never over an open WebSocket", func(t *testing.T) {
		p := startBox(t, lbOptions{Config: `{}`, Env: []string{"LANGBOT_BOX_TRUSTED_INSTANCE_UUID="}})
		c, status := dialBox(t, p.Addr, lbHeaders(lbInstance, ""))
		require.Equal(t, http.StatusSwitchingProtocols, status)
		c.Refused("box_init", map[string]any{"backend": "host"}, nil,
			"BoxValidationError: host backend requires local stdio control or WebSocket control protected by LANGBOT_BOX_CONTROL_TOKEN")
	})
	t.Run("start-up refuses it without a token", func(t *testing.T) {
		cmd := exec.Command(binPath, "box", "--host", "127.0.0.1", "--ws-control-port", "0", "--state-dir", t.TempDir())
		cmd.Env = append(os.Environ(), `LANGBOT_BOX_CONFIG={"backend":"host"}`, "LANGBOT_BOX_CONTROL_TOKEN=", "BOXRT_CONTROL_TOKEN=")
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%s", out)
		assert.Equal(t, 2, ee.ExitCode())
		assert.Contains(t, string(out), "host backend requires local stdio control")
	})
}

// TestJSONRPCMetaTenancy: JSON-RPC requests carry the same tenant context
// in "meta", and get the same namespacing and fence; requests without it
// run in the default namespace, which neither lists nor names a
// Workspace's session.
func TestJSONRPCMetaTenancy(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: `{"backend":"bwrap"}`})
	call := func(id, method, params string, gen int) Response {
		t.Helper()
		meta := ""
		if gen > 0 {
			meta = fmt.Sprintf(`,"meta":{"instance_uuid":"instance-a","workspace_uuid":"workspace-a","placement_generation":%d}`, gen)
		}
		p.Send([]byte(fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"method":%q,"params":%s%s}`+"\n", id, method, params, meta)))
		for {
			var r Response
			line := p.NextLine(time.Minute)
			require.NoError(t, json.Unmarshal(line, &r))
			if string(r.ID) == fmt.Sprintf("%q", id) {
				return r
			}
		}
	}
	r := call("a", "box_exec", `{"session_id":"s1","cmd":"echo hi"}`, 1)
	require.Nil(t, r.Error)
	assert.Contains(t, string(r.Result), `"session_id":"s1"`)
	r = call("b", "box_get_sessions", `{}`, 0)
	require.Nil(t, r.Error)
	assert.JSONEq(t, `{"sessions":[]}`, string(r.Result), "without meta: the default namespace, which lists no Workspace's session")
	r = call("b2", "box_get_session", `{"session_id":"ws-695136eeae1cb9b6af4a8226-g1-s1"}`, 0)
	require.NotNil(t, r.Error, "the default namespace cannot name a Workspace's session")
	assert.Equal(t, "BoxValidationError", r.Error.Type())
	r = call("c", "box_get_sessions", `{}`, 2)
	require.Nil(t, r.Error)
	assert.JSONEq(t, `{"sessions":[]}`, string(r.Result))
	r = call("d", "box_exec", `{"session_id":"s1","cmd":"true"}`, 1)
	require.NotNil(t, r.Error)
	assert.Equal(t, int64(-32010), r.Error.Code)
	assert.Equal(t, "PermissionError: Stale Box placement generation", r.Error.Message)
	assert.Equal(t, "PermissionError", r.Error.Type())
}

// TestLangBotRelayFrameLimit: the host's relay client refuses messages of
// 1 MiB and more, so a longer stdout line closes the relay (1009) instead
// of reaching it; the lines before it arrive whole.
func TestLangBotRelayFrameLimit(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	ctx := tenant("frames", 1)
	p.OK("box_create_session", map[string]any{"session_id": "f"}, ctx, nil)
	p.OK("box_start_managed_process", map[string]any{"session_id": "f", "spec": map[string]any{"command": "sh",
		"args": []string{"-c", `echo small; head -c 1048576 /dev/zero | tr '\0' a; echo; exec sleep 60`}}}, ctx, nil)
	h := lbHeaders(lbInstance, lbToken)
	h.Set("X-LangBot-Workspace-Id", "frames")
	h.Set("X-LangBot-Placement-Generation", "1")
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(dctx, "ws://"+p.Addr+"/v1/sessions/"+workspaceNS("frames")+"-g1-f/managed-process/default/ws",
		&websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{"mcp"}})
	require.NoError(t, err)
	defer c.CloseNow()
	c.SetReadLimit(32 << 20)
	_, first, err := c.Read(dctx)
	require.NoError(t, err)
	assert.Equal(t, "small", string(first))
	_, _, err = c.Read(dctx)
	require.Error(t, err)
	assert.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(err), "%v", err)
}
