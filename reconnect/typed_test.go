package reconnect

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Answers from docs/protocol.md's examples, so the typed results are held
// to what the wire really carries.
var protocolAnswers = map[string]string{
	"box_exec":                  `{"session_id":"s1","backend_name":"bwrap","status":"completed","exit_code":3,"stdout":"hi\n","stderr":"err\n","duration_ms":69,"stdout_truncated":false,"stderr_truncated":false,"stdout_bytes":3,"stderr_bytes":4,"session_created":false}`,
	"box_exec_start":            `{"exec_id":"x-54ebcee73aab8e7cd020477c","session_id":"s1","cmd":"python3 -c 'print(input().upper())'","status":"running","background":true,"pty":false,"stdin":true,"started_at":"2026-11-23T12:55:27.043013652Z","exit_code":null,"next_seq":0,"session_created":false}`,
	"box_exec_wait":             `{"session_id":"s1","backend_name":"bwrap","status":"running","exit_code":null,"stdout":"started\n","stderr":"","duration_ms":801,"stdout_truncated":false,"stderr_truncated":false,"stdout_bytes":8,"stderr_bytes":0,"session_created":false}`,
	"box_exec_kill":             `{"exec_id":"x-73ac838cd8fce446cccc8c59","session_id":"s1","cmd":"echo started; sleep 60","status":"canceled","background":true,"pty":false,"stdin":false,"started_at":"2026-11-23T12:55:27.246558636Z","ended_at":"2026-11-23T12:55:28.14840411Z","exit_code":null,"next_seq":1,"session_created":false}`,
	"box_exec_write_stdin":      `{"written":6,"eof":false}`,
	"box_exec_list":             `{"execs":[{"exec_id":"x-54ebcee73aab8e7cd020477c","session_id":"s1","cmd":"python3 -c 'print(input().upper())'","status":"completed","background":true,"pty":false,"stdin":true,"started_at":"2026-11-23T12:55:27.043013652Z","ended_at":"2026-11-23T12:55:27.245337609Z","exit_code":0,"next_seq":1,"session_created":false},{"exec_id":"x-73ac838cd8fce446cccc8c59","session_id":"s1","cmd":"echo started; sleep 60","status":"running","background":true,"pty":false,"stdin":false,"started_at":"2026-11-23T12:55:27.246558636Z","exit_code":null,"next_seq":1,"session_created":false}]}`,
	"box_create_session":        `{"session_id":"s1","backend_name":"bwrap","backend_session_id":"s1-1b14f60a","image":"host","network":"off","host_path_mode":"rw","mount_path":"/workspace","persistent":false,"cpus":1,"memory_mb":512,"pids_limit":128,"read_only_rootfs":true,"workspace_quota_mb":0,"host_path":null,"extra_mounts":[],"created_at":"2026-11-21T09:38:46.507628184Z","last_used_at":"2026-11-21T09:38:46.579542929Z","state":"running","session_created":true}`,
	"box_get_session":           `{"backend_name":"bwrap","backend_session_id":"mcp-2090a243","cpus":1,"created_at":"2026-11-21T09:39:34.21203065Z","extra_mounts":[{"host_path":"/srv/data","mount_path":"/data","mode":"ro"}],"host_path":"/srv/mcp","host_path_mode":"rw","image":"host","last_used_at":"2026-11-21T09:39:43.169800495Z","managed_process":{"session_id":"mcp","process_id":"default","status":"running"},"managed_processes":{"default":{"session_id":"mcp","process_id":"default","status":"running"}},"memory_mb":512,"mount_path":"/workspace","network":"off","persistent":false,"pids_limit":128,"read_only_rootfs":true,"session_id":"mcp","workspace_quota_mb":0,"state":"running"}`,
	"box_get_sessions":          `{"sessions":[{"session_id":"s1","backend_name":"bwrap","backend_session_id":"s1-1b14f60a","image":"host","network":"off","host_path_mode":"rw","mount_path":"/workspace","persistent":false,"cpus":1,"memory_mb":512,"pids_limit":128,"read_only_rootfs":true,"workspace_quota_mb":0,"host_path":null,"extra_mounts":[],"created_at":"2026-11-21T09:38:46.507628184Z","last_used_at":"2026-11-21T09:38:46.579542929Z"}]}`,
	"box_delete_session":        `{"deleted":"s1"}`,
	"box_start_managed_process": `{"session_id":"mcp","process_id":"default","status":"running","command":"sh","args":["-c","echo ready"],"cwd":"/workspace","env_keys":["API_KEY"],"attached":false,"started_at":"2026-11-21T09:39:39.158124722Z","exited_at":null,"exit_code":null,"stderr_preview":"","pending_lines":0,"relay_token":"rt"}`,
	"box_get_managed_process":   `{"session_id":"mcp","process_id":"p2","status":"exited","command":"sh","args":["-c","exit 7"],"cwd":"/workspace","env_keys":[],"attached":false,"started_at":"2026-11-21T09:39:57.084149084Z","exited_at":"2026-11-21T09:39:59.600497548Z","exit_code":7,"stderr_preview":"","pending_lines":0,"relay_token":"rt2"}`,
	"box_stop_managed_process":  `{"stopped":"p2"}`,
}

// typedFake dials a fake runtime that answers every typed call's method
// with protocolAnswers.
func typedFake(t *testing.T) (*fakeWS, *Client) {
	t.Helper()
	f := newFakeWS(t, "")
	f.canned = map[string]json.RawMessage{}
	for m, r := range protocolAnswers {
		f.canned[m] = json.RawMessage(r)
	}
	return f, dialFake(t, f)
}

// assertSent checks the params the last call of method carried.
func assertSent(t *testing.T, f *fakeWS, method, want string) {
	t.Helper()
	f.mu.Lock()
	got := f.params[method]
	f.mu.Unlock()
	assert.JSONEq(t, want, string(got), method)
}

func TestTypedExec(t *testing.T) {
	f, c := typedFake(t)
	ctx := context.Background()
	ro := false
	res, err := c.Exec(ctx, ExecSpec{
		SessionID: "s1", Cmd: "echo hi; echo err >&2; exit 3", TimeoutSec: 5,
		Env: map[string]string{"A": "1"}, ReadOnlyRootfs: &ro,
		ExtraMounts: []Mount{{HostPath: "/srv/data", MountPath: "/data", Mode: "ro"}},
		Skills:      []SkillMount{{Name: "pdf"}},
	})
	require.NoError(t, err)
	assertSent(t, f, "box_exec", `{"session_id":"s1","cmd":"echo hi; echo err >&2; exit 3","timeout_sec":5,"env":{"A":"1"},
		"read_only_rootfs":false,"extra_mounts":[{"host_path":"/srv/data","mount_path":"/data","mode":"ro"}],"skills":[{"name":"pdf"}]}`)
	require.NotNil(t, res.ExitCode)
	assert.Equal(t, 3, *res.ExitCode)
	assert.Equal(t, ExecResult{SessionID: "s1", BackendName: "bwrap", Status: "completed", ExitCode: res.ExitCode,
		Stdout: "hi\n", Stderr: "err\n", DurationMS: 69, StdoutBytes: 3, StderrBytes: 4}, res)
}

func TestTypedLiveExecs(t *testing.T) {
	f, c := typedFake(t)
	ctx := context.Background()

	info, err := c.StartExec(ctx, ExecSpec{SessionID: "s1", Cmd: "python3 -c 'print(input().upper())'"}, true)
	require.NoError(t, err)
	assertSent(t, f, "box_exec_start", `{"session_id":"s1","cmd":"python3 -c 'print(input().upper())'","stdin":true}`)
	assert.Equal(t, "x-54ebcee73aab8e7cd020477c", info.ExecID)
	assert.Equal(t, "running", info.Status)
	assert.True(t, info.Background && info.Stdin)
	assert.Nil(t, info.EndedAt)
	assert.Nil(t, info.ExitCode)
	assert.Equal(t, time.Date(2026, 11, 23, 12, 55, 27, 43013652, time.UTC), info.StartedAt)

	_, err = c.StartExec(ctx, ExecSpec{SessionID: "s1", Cmd: "true"}, false)
	require.NoError(t, err)
	assertSent(t, f, "box_exec_start", `{"session_id":"s1","cmd":"true"}`)

	for _, w := range []struct {
		data []byte
		eof  bool
		sent string
	}{
		{[]byte("hello\n"), false, `{"exec_id":"x-1","data":"hello\n"}`},
		{nil, true, `{"exec_id":"x-1","eof":true}`},
		{[]byte("caf\xe9"), true, `{"exec_id":"x-1","data_base64":"Y2Fm6Q==","eof":true}`},
		{nil, false, `{"exec_id":"x-1","data":""}`},
	} {
		n, err := c.WriteStdin(ctx, "x-1", w.data, w.eof)
		require.NoError(t, err)
		assert.Equal(t, 6, n)
		assertSent(t, f, "box_exec_write_stdin", w.sent)
	}

	res, err := c.WaitExec(ctx, "x-1", 500*time.Millisecond)
	require.NoError(t, err)
	assertSent(t, f, "box_exec_wait", `{"exec_id":"x-1","timeout_sec":0.5}`)
	assert.Equal(t, "running", res.Status)
	assert.Nil(t, res.ExitCode)
	assert.Equal(t, "started\n", res.Stdout)
	_, err = c.WaitExec(ctx, "x-1", 0)
	require.NoError(t, err)
	assertSent(t, f, "box_exec_wait", `{"exec_id":"x-1"}`)

	killed, err := c.KillExec(ctx, "x-2", "")
	require.NoError(t, err)
	assertSent(t, f, "box_exec_kill", `{"exec_id":"x-2"}`)
	assert.Equal(t, "canceled", killed.Status)
	require.NotNil(t, killed.EndedAt)
	assert.Equal(t, int64(1), killed.NextSeq)
	_, err = c.KillExec(ctx, "x-2", "TERM")
	require.NoError(t, err)
	assertSent(t, f, "box_exec_kill", `{"exec_id":"x-2","signal":"TERM"}`)

	execs, err := c.ListExecs(ctx, "s1")
	require.NoError(t, err)
	assertSent(t, f, "box_exec_list", `{"session_id":"s1"}`)
	require.Len(t, execs, 2)
	require.NotNil(t, execs[0].ExitCode)
	assert.Equal(t, 0, *execs[0].ExitCode)
	assert.Equal(t, "running", execs[1].Status)
}

func TestTypedSessions(t *testing.T) {
	f, c := typedFake(t)
	ctx := context.Background()

	s, err := c.CreateSession(ctx, ExecSpec{SessionID: "s1", Persistent: true, MemoryMB: 256})
	require.NoError(t, err)
	assertSent(t, f, "box_create_session", `{"session_id":"s1","persistent":true,"memory_mb":256}`)
	assert.True(t, s.SessionCreated)
	assert.Equal(t, "s1-1b14f60a", s.BackendSessionID)
	assert.Equal(t, 1.0, s.CPUs)
	assert.True(t, s.ReadOnlyRootfs)
	assert.Nil(t, s.HostPath)
	assert.Empty(t, s.ExtraMounts)
	assert.Equal(t, "running", s.State)

	got, err := c.GetSession(ctx, "mcp")
	require.NoError(t, err)
	assertSent(t, f, "box_get_session", `{"session_id":"mcp"}`)
	require.NotNil(t, got.HostPath)
	assert.Equal(t, "/srv/mcp", *got.HostPath)
	assert.Equal(t, []Mount{{HostPath: "/srv/data", MountPath: "/data", Mode: "ro"}}, got.ExtraMounts)
	require.NotNil(t, got.ManagedProcess)
	assert.Equal(t, "running", got.ManagedProcess.Status)
	assert.Equal(t, "default", got.ManagedProcesses["default"].ProcessID)

	all, err := c.ListSessions(ctx)
	require.NoError(t, err)
	assertSent(t, f, "box_get_sessions", `{}`)
	require.Len(t, all, 1)
	assert.Equal(t, "s1", all[0].SessionID)

	require.NoError(t, c.DeleteSession(ctx, "s1"))
	assertSent(t, f, "box_delete_session", `{"session_id":"s1"}`)
}

func TestTypedProcesses(t *testing.T) {
	f, c := typedFake(t)
	ctx := context.Background()

	p, err := c.StartProcess(ctx, "mcp", ProcessSpec{Command: "sh", Args: []string{"-c", "echo ready"}, Env: map[string]string{"API_KEY": "x"}})
	require.NoError(t, err)
	assertSent(t, f, "box_start_managed_process", `{"session_id":"mcp","spec":{"command":"sh","args":["-c","echo ready"],"env":{"API_KEY":"x"}}}`)
	assert.Equal(t, "default", p.ProcessID)
	assert.Equal(t, []string{"API_KEY"}, p.EnvKeys)
	assert.Equal(t, "rt", p.RelayToken)
	assert.Nil(t, p.ExitedAt)

	got, err := c.GetProcess(ctx, "mcp", "p2")
	require.NoError(t, err)
	assertSent(t, f, "box_get_managed_process", `{"session_id":"mcp","process_id":"p2"}`)
	assert.Equal(t, "exited", got.Status)
	require.NotNil(t, got.ExitCode)
	assert.Equal(t, 7, *got.ExitCode)
	require.NotNil(t, got.ExitedAt)

	require.NoError(t, c.StopProcess(ctx, "mcp", ""))
	assertSent(t, f, "box_stop_managed_process", `{"session_id":"mcp","process_id":""}`)
}

func TestTypedExecStream(t *testing.T) {
	f, c := typedFake(t)
	res, err := c.ExecStream(context.Background(), ExecSpec{SessionID: "s1", Cmd: "echo hi"}, func(ExecOutput) {})
	require.NoError(t, err)
	assertSent(t, f, "box_exec", `{"session_id":"s1","cmd":"echo hi","stream":true}`)
	require.NotNil(t, res.ExitCode)
	assert.Equal(t, 3, *res.ExitCode)
	assert.Equal(t, "completed", res.Status)
}
