package test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/actions"
)

// isoTarget is what a probe names of Workspace A: its session (by the
// logical or the physical id), a session to create beside it, its live
// exec, snapshot, watch and managed process.
type isoTarget struct {
	Session, NewSession, Exec, Snapshot, Watch, Process, Subscription string
}

// isoProbe is one call another namespace makes against A.
type isoProbe struct {
	params func(isoTarget) map[string]any
	// unknown: the answer must be exactly the one an unknown id gets (the
	// same params with unknownTarget's ids): nothing tells that A's exists.
	unknown bool
}

// isoEntry is a method's row: its probes, or why it names no id of a
// session, exec, snapshot, watch or process.
type isoEntry struct {
	none   string
	probes []isoProbe
}

// pwn is what a probe's command or write would leave in A's workspace.
const pwn = "echo pwned > /workspace/f.txt"

func onSession(extra map[string]any) func(isoTarget) map[string]any {
	return func(x isoTarget) map[string]any {
		out := map[string]any{"session_id": x.Session}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
}

func onExec(extra map[string]any) isoProbe {
	return isoProbe{unknown: true, params: func(x isoTarget) map[string]any {
		out := map[string]any{"exec_id": x.Exec}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}}
}

func onSnapshot() isoProbe {
	return isoProbe{unknown: true, params: func(x isoTarget) map[string]any { return map[string]any{"snapshot_id": x.Snapshot} }}
}

func onProcess() isoProbe {
	return isoProbe{unknown: true, params: func(x isoTarget) map[string]any {
		return map[string]any{"session_id": x.Session, "process_id": x.Process}
	}}
}

func fromSnapshot(session string) isoProbe {
	return isoProbe{unknown: true, params: func(x isoTarget) map[string]any {
		return map[string]any{"session_id": session, "from_snapshot": x.Snapshot, "cmd": "cat /workspace/f.txt"}
	}}
}

const (
	noIDHost   = "host control: no tenant context, no tenant id"
	noIDSkills = "skills live in the Workspace's own skill store (skills.Scoped); no session, exec, snapshot, watch or process id"
)

// isolationTable has a row for every method of the catalogue.
var isolationTable = map[string]isoEntry{
	"__ping": {none: noIDHost}, "__file_chunk": {none: noIDHost}, "box_init": {none: noIDHost},
	"box_health": {none: noIDHost}, "box_get_backend_info": {none: noIDHost}, "box_shutdown": {none: noIDHost},
	"box_upsert_sandbox_admission_grant": {none: noIDHost}, "box_revoke_sandbox_admission_grant": {none: noIDHost},
	"box_verify_shared_workspace": {none: noIDHost},
	"box_status":                  {none: "counts the caller's placement only (TestLangBotTenancy)"},
	"box_get_storage_analysis":    {none: "measures the caller's placement only (TestLangBotTenancy)"},
	"box_list_skills":             {none: noIDSkills}, "box_get_skill": {none: noIDSkills}, "box_create_skill": {none: noIDSkills},
	"box_update_skill": {none: noIDSkills}, "box_delete_skill": {none: noIDSkills}, "box_scan_skill_directory": {none: noIDSkills},
	"box_list_skill_files": {none: noIDSkills}, "box_read_skill_file": {none: noIDSkills}, "box_write_skill_file": {none: noIDSkills},
	"box_preview_skill_zip": {none: noIDSkills}, "box_install_skill_zip": {none: noIDSkills},

	"box_exec":            {probes: []isoProbe{{params: onSession(map[string]any{"cmd": pwn})}, fromSnapshot("restore-b")}},
	"box_exec_start":      {probes: []isoProbe{{params: onSession(map[string]any{"cmd": pwn})}, fromSnapshot("restore-c")}},
	"box_create_session":  {probes: []isoProbe{{params: onSession(nil)}, fromSnapshot("restore-d")}},
	"box_get_session":     {probes: []isoProbe{{params: onSession(nil)}}},
	"box_get_sessions":    {probes: []isoProbe{{params: func(isoTarget) map[string]any { return map[string]any{} }}}},
	"box_delete_session":  {probes: []isoProbe{{params: onSession(nil)}}},
	"box_suspend_session": {probes: []isoProbe{{params: onSession(nil)}}},
	"box_resume_session":  {probes: []isoProbe{{params: onSession(nil)}}},
	"box_fork_session": {probes: []isoProbe{
		{params: func(x isoTarget) map[string]any {
			return map[string]any{"session_id": x.Session, "new_session_id": "fork-b"}
		}},
		{params: func(x isoTarget) map[string]any {
			return map[string]any{"session_id": "own-b", "new_session_id": x.NewSession}
		}},
	}},
	"box_snapshot_session": {probes: []isoProbe{{params: onSession(nil)}}},
	"box_update_network":   {probes: []isoProbe{{params: onSession(map[string]any{"network": "on"})}}},
	"box_list_snapshots":   {probes: []isoProbe{{params: func(isoTarget) map[string]any { return map[string]any{} }}}},
	"box_get_snapshot":     {probes: []isoProbe{onSnapshot()}},
	"box_delete_snapshot":  {probes: []isoProbe{onSnapshot()}},
	"box_exec_list":        {probes: []isoProbe{{params: onSession(nil)}}},
	"box_exec_wait":        {probes: []isoProbe{onExec(map[string]any{"timeout_sec": 1})}},
	"box_exec_kill":        {probes: []isoProbe{onExec(map[string]any{"signal": "KILL"})}},
	"box_exec_write_stdin": {probes: []isoProbe{onExec(map[string]any{"data": "pwned\n"})}},
	"box_exec_attach":      {probes: []isoProbe{onExec(map[string]any{"from_seq": 0})}},
	"box_exec_resize":      {probes: []isoProbe{onExec(map[string]any{"rows": 10, "cols": 10})}},
	"box_start_managed_process": {probes: []isoProbe{{params: onSession(map[string]any{
		"spec": map[string]any{"process_id": "pb", "command": "sh", "args": []string{"-c", pwn + "; sleep 300"}}})}}},
	"box_get_managed_process":  {probes: []isoProbe{onProcess()}},
	"box_stop_managed_process": {probes: []isoProbe{onProcess()}},
	"box_fs_read":              {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace/f.txt"})}}},
	"box_fs_write": {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace/f.txt",
		"data_base64": "cHduZWQK"})}}},
	"box_fs_list":   {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace"})}}},
	"box_fs_stat":   {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace/f.txt"})}}},
	"box_fs_remove": {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace/f.txt"})}}},
	"box_fs_mkdir":  {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace/dir-b"})}}},
	"box_fs_rename": {probes: []isoProbe{{params: onSession(map[string]any{"from": "/workspace/f.txt", "to": "/workspace/g.txt"})}}},
	"box_fs_watch":  {probes: []isoProbe{{params: onSession(map[string]any{"path": "/workspace"})}}},
	"box_fs_unwatch": {probes: []isoProbe{{unknown: true, params: func(x isoTarget) map[string]any {
		return map[string]any{"watch_id": x.Watch}
	}}}},
	"box_expose_port":         {probes: []isoProbe{{params: onSession(map[string]any{"port": 8000})}}},
	"box_unexpose_port":       {probes: []isoProbe{{params: onSession(map[string]any{"port": 8000})}}},
	"box_get_session_metrics": {probes: []isoProbe{{params: onSession(nil)}}},
	"box_subscribe_events":    {probes: []isoProbe{{params: onSession(nil)}}},
	"box_unsubscribe_events": {probes: []isoProbe{{unknown: true, params: func(x isoTarget) map[string]any {
		return map[string]any{"subscription_id": x.Subscription}
	}}}},
}

// unknown is x with ids of the right shape that nothing holds in place
// of A's exec, snapshot, watch and process (the session stays).
func (x isoTarget) unknown() isoTarget {
	x.Exec, x.Snapshot, x.Watch, x.Process = "x-000000000000000000000000", "snap-0000000000000000",
		"w-00000000000000000000000000000000", "nosuch"
	x.Subscription = "sub-00000000000000000000000000000000"
	return x
}

// catalogue is every method the binary serves: the tenancy layer's list,
// from the same source the binary is built from.
func catalogue() []string {
	t := actions.NewTenancy(actions.New(nil, nil, actions.Server{}), actions.NewTrust("", true), actions.TenancyOptions{})
	out := t.Methods()
	slices.Sort(out)
	return out
}

func metaOf(workspace string, gen int64) map[string]any {
	return map[string]any{"instance_uuid": lbInstance, "workspace_uuid": workspace, "placement_generation": gen}
}

// workspaceA is Workspace A's state the probes go after.
type workspaceA struct {
	meta              map[string]any
	physical, backend string
	exec, snap, watch string
	sub               string
	token             string // of A's exposed port 8000
}

// setUpWorkspaceA gives A a persistent session s1 with a secret file, a
// live exec with stdin, a snapshot, a managed process and a watch.
func setUpWorkspaceA(t *testing.T, p *Proc) workspaceA {
	t.Helper()
	a := workspaceA{meta: metaOf("workspace-a", 1), physical: workspaceNS("workspace-a") + "-g1-s1"}
	must := func(method string, params map[string]any, out any) {
		t.Helper()
		r := p.CallMeta(a.meta, method, params, 2*time.Minute)
		require.Nil(t, r.Error, "%s: %+v", method, r.Error)
		if out != nil {
			require.NoError(t, json.Unmarshal(r.Result, out))
		}
	}
	var res ExecResult
	must("box_exec", map[string]any{"session_id": "s1", "persistent": true, "cmd": "echo secret-a > /workspace/f.txt"}, &res)
	require.Equal(t, 0, *res.ExitCode)
	var sess sessionState
	must("box_get_session", map[string]any{"session_id": "s1"}, &sess)
	a.backend = sess.BackendSessionID
	require.NotEmpty(t, a.backend)
	var x struct {
		ExecID string `json:"exec_id"`
	}
	must("box_exec_start", map[string]any{"session_id": "s1", "persistent": true, "cmd": "sleep 300", "stdin": true}, &x)
	a.exec = x.ExecID
	var snap struct {
		ID string `json:"snapshot_id"`
	}
	must("box_snapshot_session", map[string]any{"session_id": "s1"}, &snap)
	a.snap = snap.ID
	require.NotEmpty(t, a.snap)
	must("box_start_managed_process", map[string]any{"session_id": "s1",
		"spec": map[string]any{"process_id": "pa", "command": "sleep", "args": []string{"300"}}}, nil)
	var w struct {
		WatchID string `json:"watch_id"`
	}
	must("box_fs_watch", map[string]any{"session_id": "s1", "path": "/workspace", "interval_ms": 60000}, &w)
	a.watch = w.WatchID
	var sub struct {
		SubscriptionID string `json:"subscription_id"`
	}
	must("box_subscribe_events", map[string]any{"session_id": "s1"}, &sub)
	a.sub = sub.SubscriptionID
	var port struct {
		Token string `json:"token"`
	}
	must("box_expose_port", map[string]any{"session_id": "s1", "port": 8000}, &port)
	a.token = port.Token
	return a
}

// checkUntouched asserts A's session, file, exec, snapshot, process and
// watch are as A left them, and that A's namespace holds only s1.
func (a workspaceA) checkUntouched(t *testing.T, p *Proc) {
	t.Helper()
	call := func(method string, params map[string]any) json.RawMessage {
		r := p.CallMeta(a.meta, method, params, 2*time.Minute)
		require.Nil(t, r.Error, "%s: %+v", method, r.Error)
		return r.Result
	}
	var sessions struct {
		Sessions []sessionState `json:"sessions"`
	}
	require.NoError(t, json.Unmarshal(call("box_get_sessions", map[string]any{}), &sessions))
	require.Len(t, sessions.Sessions, 1, "A's namespace holds only s1: %+v", sessions.Sessions)
	assert.Equal(t, "s1", sessions.Sessions[0].SessionID)
	assert.Equal(t, a.backend, sessions.Sessions[0].BackendSessionID, "s1 was not deleted and re-created")
	assert.Equal(t, "running", sessions.Sessions[0].State, "s1 was not suspended")
	var execs struct {
		Execs []struct {
			ExecID string `json:"exec_id"`
			Status string `json:"status"`
		} `json:"execs"`
	}
	require.NoError(t, json.Unmarshal(call("box_exec_list", map[string]any{"session_id": "s1"}), &execs))
	require.Len(t, execs.Execs, 1, "no exec ran in A's session: %+v", execs.Execs)
	assert.Equal(t, a.exec, execs.Execs[0].ExecID)
	assert.Equal(t, "running", execs.Execs[0].Status, "A's exec was not killed")
	var proc struct{ Status string }
	require.NoError(t, json.Unmarshal(call("box_get_managed_process", map[string]any{"session_id": "s1", "process_id": "pa"}), &proc))
	assert.Equal(t, "running", proc.Status, "A's process was not stopped")
	var res ExecResult
	require.NoError(t, json.Unmarshal(call("box_exec", map[string]any{"session_id": "s1", "persistent": true,
		"cmd": "cat /workspace/f.txt; ls -A /workspace"}), &res))
	assert.Equal(t, "secret-a\nf.txt\n", res.Stdout, "A's workspace is as A left it")
	snaps := call("box_list_snapshots", map[string]any{})
	assert.Contains(t, string(snaps), a.snap, "A's snapshot is still A's")
	call("box_get_snapshot", map[string]any{"snapshot_id": a.snap})
	call("box_fs_unwatch", map[string]any{"watch_id": a.watch})
	call("box_unsubscribe_events", map[string]any{"subscription_id": a.sub})
	var un struct {
		Unexposed bool `json:"unexposed"`
	}
	require.NoError(t, json.Unmarshal(call("box_unexpose_port", map[string]any{"session_id": "s1", "port": 8000}), &un))
	assert.True(t, un.Unexposed, "A's port is still exposed")
}

// TestTenantIsolationCatalogue: for every method of the catalogue that
// names a session, exec, snapshot, watch or process, Workspace B tries A's
// logical id and A's physical id, and a caller without a context (the
// default namespace) A's physical id. None reaches A: an exec, snapshot,
// watch or process of A answers exactly as an unknown one; nothing A holds
// shows in an answer; and A's session, files, exec, snapshot, process and
// watch are untouched. A method without a row fails the test.
func TestTenantIsolationCatalogue(t *testing.T) {
	methods := catalogue()
	for _, m := range methods {
		if _, ok := isolationTable[m]; !ok {
			t.Errorf("method %s has no row in isolationTable: say which ids it takes and probe them from another Workspace", m)
		}
	}
	for m := range isolationTable {
		if !slices.Contains(methods, m) {
			t.Errorf("isolationTable has a row for %s, which the catalogue does not serve", m)
		}
	}
	require.False(t, t.Failed())

	p := Start(t, Options{Stdio: true, Config: `{"backend":"bwrap"}`})
	a := setUpWorkspaceA(t, p)
	ns := workspaceNS("workspace-a")
	callers := []struct {
		name   string
		meta   map[string]any
		target isoTarget
	}{
		{"B names A's logical ids", metaOf("workspace-b", 1), isoTarget{Session: "s1", NewSession: "s2"}},
		{"B names A's physical ids", metaOf("workspace-b", 1), isoTarget{Session: a.physical, NewSession: ns + "-g1-s2"}},
		{"no context names A's physical ids", nil, isoTarget{Session: a.physical, NewSession: ns + "-g1-s2"}},
	}
	// The file's content as box_fs_read carries it, too.
	secrets := []string{"secret-a", base64.StdEncoding.EncodeToString([]byte("secret-a\n")), a.backend, a.exec, a.snap, a.watch, a.sub, a.token}
	probes := 0
	for _, c := range callers {
		// A session of the caller's own, for a fork into A's namespace.
		require.Nil(t, p.CallMeta(c.meta, "box_create_session", map[string]any{"session_id": "own-b"}, 2*time.Minute).Error)
		target := c.target
		target.Exec, target.Snapshot, target.Watch, target.Process, target.Subscription = a.exec, a.snap, a.watch, "pa", a.sub
		for _, m := range methods {
			for i, probe := range isolationTable[m].probes {
				probes++
				name := fmt.Sprintf("%s/%s#%d", c.name, m, i)
				params := probe.params(target)
				sent, _ := json.Marshal(params)
				r := p.CallMeta(c.meta, m, params, 2*time.Minute)
				raw, _ := json.Marshal(r)
				for _, s := range secrets {
					if !bytes.Contains(sent, []byte(s)) {
						assert.NotContains(t, string(raw), s, "%s: the answer shows what A holds", name)
					}
				}
				if c.meta == nil && strings.Contains(string(sent), ns) {
					assert.NotNil(t, r.Error, "%s: a caller without a context named a Workspace's session", name)
				}
				if !probe.unknown {
					continue
				}
				u := p.CallMeta(c.meta, m, probe.params(target.unknown()), 2*time.Minute)
				if assert.NotNil(t, u.Error, "%s: an unknown id is refused", name) && assert.NotNil(t, r.Error, "%s: A's id reached A", name) {
					assert.Equal(t, u.Error.Type(), r.Error.Type(), "%s: A's id answers as an unknown one (%s vs %s)", name, r.Error.Message, u.Error.Message)
					assert.Equal(t, u.Error.Code, r.Error.Code, name)
					assert.Equal(t, u.Error.Data["reason"], r.Error.Data["reason"], name)
				}
			}
		}
	}
	require.Greater(t, probes, 40, "the probes ran")
	a.checkUntouched(t, p)
}

// TestTenantRetiredGenerationStaysRetired: once Workspace A moves to
// generation 2, its generation-1 session is gone for good: neither A at
// generation 1 (stale), nor B, nor a caller without a context brings it
// back, by exec, create or fork.
func TestTenantRetiredGenerationStaysRetired(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: `{"backend":"bwrap"}`})
	a1, a2, b := metaOf("workspace-a", 1), metaOf("workspace-a", 2), metaOf("workspace-b", 1)
	gen1 := workspaceNS("workspace-a") + "-g1-s1"
	r := p.CallMeta(a1, "box_exec", map[string]any{"session_id": "s1", "cmd": "echo secret-a > /workspace/f.txt"}, 2*time.Minute)
	require.Nil(t, r.Error, "%+v", r.Error)
	r = p.CallMeta(a2, "box_get_sessions", map[string]any{}, time.Minute)
	require.Nil(t, r.Error, "%+v", r.Error)
	require.Eventually(t, func() bool {
		return created(p.Stderr(), gen1) == 1 && strings.Contains(p.Stderr(), `"session destroyed"`)
	},
		10*time.Second, 50*time.Millisecond, "generation 2 retired generation 1's session")

	attempts := []struct {
		meta   map[string]any
		method string
		params map[string]any
	}{
		{a1, "box_exec", map[string]any{"session_id": "s1", "cmd": "true"}},
		{b, "box_exec", map[string]any{"session_id": gen1, "cmd": "true"}},
		{nil, "box_exec", map[string]any{"session_id": gen1, "cmd": "true"}},
		{nil, "box_exec_start", map[string]any{"session_id": gen1, "cmd": "true"}},
		{nil, "box_create_session", map[string]any{"session_id": gen1}},
		{b, "box_create_session", map[string]any{"session_id": gen1}},
		{b, "box_fork_session", map[string]any{"session_id": "own-b", "new_session_id": gen1}},
		{nil, "box_fork_session", map[string]any{"session_id": "own", "new_session_id": gen1}},
	}
	require.Nil(t, p.CallMeta(b, "box_exec", map[string]any{"session_id": "own-b", "cmd": "true"}, time.Minute).Error)
	require.Nil(t, p.Call("box_exec", map[string]any{"session_id": "own", "cmd": "true"}, time.Minute).Error)
	for _, at := range attempts {
		r := p.CallMeta(at.meta, at.method, at.params, 2*time.Minute)
		if at.meta == nil {
			require.NotNil(t, r.Error, "%s without a context named %s", at.method, gen1)
			assert.Equal(t, "BoxValidationError", r.Error.Type(), r.Error.Message)
		}
	}
	assert.Equal(t, 1, created(p.Stderr(), gen1), "nobody re-created the retired generation's session")
	r = p.Call("box_get_sessions", map[string]any{}, time.Minute)
	require.Nil(t, r.Error)
	assert.NotContains(t, string(r.Result), workspaceNS("workspace-a"), "the default namespace lists no Workspace's session")
}

// created counts the "session created" log lines of a physical id.
func created(stderr, physical string) int {
	n := 0
	for _, l := range strings.Split(stderr, "\n") {
		if strings.Contains(l, `"session created"`) && strings.Contains(l, `"session_id":"`+physical+`"`) {
			n++
		}
	}
	return n
}

// TestLangBotTenantIsolation is the catalogue test's representative calls
// over the LangBot envelope (`boxrt box -s`, "context"): Workspace B names
// A's session by its logical and its physical id to read its file, run a
// command, fork, suspend it, and goes after A's snapshot; then A's retired
// generation-1 session stays gone.
func TestLangBotTenantIsolation(t *testing.T) {
	p := startBox(t, lbOptions{Stdio: true, Config: hostBoxConfig, Token: lbToken})
	a1, a2, b1 := tenant("workspace-a", 1), tenant("workspace-a", 2), tenant("workspace-b", 1)
	phys := workspaceNS("workspace-a") + "-g1-s1"
	p.OK("box_exec", map[string]any{"session_id": "s1", "persistent": true, "cmd": "echo secret-a > /workspace/f.txt"}, a1, nil)
	var snap struct {
		ID string `json:"snapshot_id"`
	}
	p.OK("box_snapshot_session", map[string]any{"session_id": "s1"}, a1, &snap)
	require.NotEmpty(t, snap.ID)

	for _, id := range []string{"s1", phys} {
		p.Refused("box_fs_read", map[string]any{"session_id": id, "path": "/workspace/f.txt"}, b1, "BoxSessionNotFoundError: ")
		p.Refused("box_fork_session", map[string]any{"session_id": id, "new_session_id": "fork-b"}, b1, "BoxSessionNotFoundError: ")
		p.Refused("box_suspend_session", map[string]any{"session_id": id}, b1, "BoxSessionNotFoundError: ")
		var x struct {
			ExecID    string `json:"exec_id"`
			SessionID string `json:"session_id"`
		}
		p.OK("box_exec_start", map[string]any{"session_id": id, "cmd": pwn}, b1, &x)
		assert.Equal(t, id, x.SessionID, "B's own session, by the id B sent")
		p.OK("box_exec_wait", map[string]any{"exec_id": x.ExecID}, b1, nil)
	}
	var list struct {
		Snapshots []map[string]any `json:"snapshots"`
	}
	p.OK("box_list_snapshots", map[string]any{}, b1, &list)
	assert.Empty(t, list.Snapshots, "B lists none of A's snapshots")
	p.Refused("box_get_snapshot", map[string]any{"snapshot_id": snap.ID}, b1, "BoxValidationError: snapshot "+snap.ID+" does not exist")
	p.Refused("box_exec", map[string]any{"session_id": "r", "from_snapshot": snap.ID, "cmd": "cat /workspace/f.txt"}, b1,
		"BoxValidationError: snapshot "+snap.ID+" does not exist")
	p.OK("box_list_snapshots", map[string]any{}, a1, &list)
	require.Len(t, list.Snapshots, 1, "A lists its own")
	assert.Equal(t, "s1", list.Snapshots[0]["session_id"], "by its logical session id")

	var res map[string]any
	p.OK("box_exec", map[string]any{"session_id": "s1", "persistent": true, "cmd": "cat /workspace/f.txt"}, a1, &res)
	assert.Equal(t, "secret-a\n", res["stdout"], "no command of B ran in A's session")
	var sess map[string]any
	p.OK("box_get_session", map[string]any{"session_id": "s1"}, a1, &sess)
	assert.Equal(t, "running", sess["state"], "B did not suspend A's session")

	p.OK("box_get_sessions", map[string]any{}, a2, nil) // retires generation 1
	p.Refused("box_exec", map[string]any{"session_id": "s1", "cmd": "true"}, a1, "PermissionError: Stale Box placement generation")
	p.OK("box_exec", map[string]any{"session_id": phys, "cmd": "true"}, b1, nil)
	p.OK("box_create_session", map[string]any{"session_id": phys}, b1, nil)
	assert.Equal(t, 1, created(p.stderr.String(), phys), "nobody re-created A's retired generation-1 session")
}

// TestTenantHTTPRoutes: the files endpoint and the relay name a session
// by its physical id and resolve it within the placement their LangBot
// headers name; another Workspace's headers find nothing, and a request
// without them (the default namespace) cannot name a Workspace's session,
// not even with the control token.
func TestTenantHTTPRoutes(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: `{"backend":"bwrap"}`})
	var health struct {
		RelayToken string `json:"relay_token"`
	}
	p.MustCall("box_health", map[string]any{}, &health)
	token := health.RelayToken
	require.NotEmpty(t, token)
	a := metaOf("workspace-a", 1)
	r := p.CallMeta(a, "box_exec", map[string]any{"session_id": "s1", "cmd": "echo secret-a > /workspace/f.txt"}, 2*time.Minute)
	require.Nil(t, r.Error, "%+v", r.Error)
	r = p.CallMeta(a, "box_start_managed_process", map[string]any{"session_id": "s1",
		"spec": map[string]any{"process_id": "pa", "command": "cat"}}, 2*time.Minute)
	require.Nil(t, r.Error, "%+v", r.Error)
	phys := workspaceNS("workspace-a") + "-g1-s1"
	headers := func(workspace string) http.Header {
		h := http.Header{"Authorization": {"Bearer " + token}}
		if workspace != "" {
			h.Set("X-LangBot-Instance-Id", lbInstance)
			h.Set("X-LangBot-Workspace-Id", workspace)
			h.Set("X-LangBot-Placement-Generation", "1")
		}
		return h
	}
	get := func(session, workspace string) (int, string) {
		req, err := http.NewRequest("GET", filesURL(p.Addr, session, "/workspace/f.txt"), nil)
		require.NoError(t, err)
		req.Header = headers(workspace)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	status, body := get(phys, "")
	assert.Equal(t, http.StatusBadRequest, status, "no headers: the default namespace cannot name %s: %s", phys, body)
	assert.NotContains(t, body, "secret-a")
	status, body = get(phys, "workspace-b")
	assert.Equal(t, http.StatusNotFound, status, "another Workspace's headers find nothing: %s", body)
	assert.NotContains(t, body, "secret-a")
	status, body = get("s1", "workspace-a")
	assert.Equal(t, http.StatusNotFound, status, "the path names the physical id, as on the relay: %s", body)
	status, body = get(phys, "workspace-a")
	assert.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, "secret-a\n", body, "A's own headers reach A's file")

	dial := func(workspace string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, resp, err := websocket.Dial(ctx, "ws://"+p.Addr+"/v1/sessions/"+phys+"/managed-process/pa/ws",
			&websocket.DialOptions{HTTPHeader: headers(workspace)})
		if err != nil {
			require.NotNil(t, resp, "%v", err)
			resp.Body.Close()
			return resp.StatusCode
		}
		c.CloseNow()
		return http.StatusSwitchingProtocols
	}
	assert.NotEqual(t, http.StatusSwitchingProtocols, dial(""), "the control token alone does not reach a Workspace's process")
	assert.Equal(t, http.StatusUnauthorized, dial("workspace-b"), "another Workspace's headers")
	assert.Equal(t, http.StatusSwitchingProtocols, dial("workspace-a"), "A's own headers attach")

	// An exposed port of A (nothing listens on it: reaching it is 502).
	var x struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	}
	r = p.CallMeta(a, "box_expose_port", map[string]any{"session_id": "s1", "port": 8000}, time.Minute)
	require.Nil(t, r.Error, "%+v", r.Error)
	require.NoError(t, json.Unmarshal(r.Result, &x))
	assert.Contains(t, x.URL, "/v1/sessions/"+phys+"/ports/8000/", "the URL names the physical id, as the relay's")
	port := func(workspace, portToken string) int {
		req, err := http.NewRequest("GET", x.URL, nil)
		require.NoError(t, err)
		req.Header = headers(workspace)
		req.Header.Del("Authorization") // the control token opens no port anyway
		if portToken != "" {
			req.Header.Set("X-Boxrt-Port-Token", portToken)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusNotFound, port("workspace-b", x.Token), "another Workspace's headers, even with A's token")
	assert.Equal(t, http.StatusUnauthorized, port("workspace-a", ""), "A's headers without the port's token")
	assert.Equal(t, http.StatusBadGateway, port("workspace-a", x.Token), "A's headers and token reach the port")
	assert.Equal(t, http.StatusBadGateway, port("", x.Token), "the token alone reaches it (a browser link)")
}
