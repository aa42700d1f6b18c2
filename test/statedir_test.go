package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSecondServeRefusesALockedStateDir: one runtime per state directory;
// the second says who holds it and how to choose another, and the lock
// file the first leaves behind never stops a later start.
func TestSecondServeRefusesALockedStateDir(t *testing.T) {
	first := Start(t, Options{Stdio: true})
	for name, args := range map[string][]string{
		"serve": {"serve", "--listen", "", "--state-dir", first.State},
		"box":   {"box", "--ws-control-port", "0", "--host", "127.0.0.1", "--state-dir", first.State},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
			require.NoError(t, ctx.Err(), "a second runtime on a locked state directory kept running; its log:\n%s", out)
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "output: %s", out)
			assert.NotZero(t, ee.ExitCode())
			assert.Contains(t, string(out), fmt.Sprintf("pid %d", first.cmd.Process.Pid), "names the holder")
			assert.Contains(t, string(out), "--state-dir", "says how to choose another")
		})
	}
	require.Nil(t, first.Call("__ping", map[string]any{}, time.Minute).Error, "the first runtime keeps serving")
	first.Stop()
	_, err := os.Stat(filepath.Join(first.State, "lock"))
	require.NoError(t, err, "the lock file stays")
	again := Start(t, Options{Stdio: true, StateDir: first.State})
	require.Nil(t, again.Call("__ping", map[string]any{}, time.Minute).Error)
}

// execCreated is box_exec's result with session_created, which must be
// present.
type execCreated struct {
	Stdout         string `json:"stdout"`
	SessionCreated *bool  `json:"session_created"`
}

func mustExecCreated(t *testing.T, p *Proc, params map[string]any) execCreated {
	t.Helper()
	var res execCreated
	p.MustCall("box_exec", params, &res)
	require.NotNil(t, res.SessionCreated, "session_created is always in box_exec's result")
	return res
}

// TestSpawnLeavesTheServersSessionsAlone is issue 35's first finding: a
// runtime serving, a session with a file, then the help's quick start
// `boxrt call box_exec … --spawn` on the same (default) state directory.
// The spawned runtime gets a private directory instead, so the server's
// session and its file survive, and the private directory is removed.
func TestSpawnLeavesTheServersSessionsAlone(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			cfg := "{" + backendConfigs[backend] + "}"
			if backend == "docker" {
				removeInstanceContainers(t, state)
			}
			server := Start(t, Options{Stdio: true, StateDir: state, Config: cfg})
			execIn(t, server, map[string]any{"session_id": "keep", "cmd": "echo kept > /workspace/f"})

			tmp := t.TempDir()
			stdout, stderr, code := runCall(t, []string{"BOXRT_STATE_DIR=" + state, "BOXRT_CONFIG=" + cfg, "TMPDIR=" + tmp},
				"", "box_exec", `{"session_id":"other","cmd":"echo hi"}`, "--spawn")
			require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
			var spawned execCreated
			require.NoError(t, json.Unmarshal([]byte(stdout), &spawned))
			assert.Equal(t, "hi\n", spawned.Stdout)

			var res execCreated
			server.MustCall("box_exec", map[string]any{"session_id": "keep", "cmd": "cat /workspace/f"}, &res)
			assert.Equal(t, "kept\n", res.Stdout, "the server's session kept its workspace")
			var list struct {
				Sessions []map[string]any `json:"sessions"`
			}
			server.MustCall("box_get_sessions", map[string]any{}, &list)
			require.Len(t, list.Sessions, 1, "the spawned runtime's session is not the server's: %v", list.Sessions)
			assert.Equal(t, "running", list.Sessions[0]["state"])
			require.NotNil(t, res.SessionCreated, "session_created is always in box_exec's result")
			assert.False(t, *res.SessionCreated, "the server's session was not recreated")
			require.NotNil(t, spawned.SessionCreated)
			assert.True(t, *spawned.SessionCreated)

			entries, err := os.ReadDir(tmp)
			require.NoError(t, err)
			for _, e := range entries {
				assert.False(t, strings.HasPrefix(e.Name(), "boxrt-private-"), "private state directory %s left behind", e.Name())
			}
		})
	}
}

// TestSessionCreatedAndLostSandboxes: session_created says when a call
// made the session, including after its sandbox was removed behind
// boxrt's back, and the listing never reports such a session as running.
func TestSessionCreatedAndLostSandboxes(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			if backend == "docker" {
				removeInstanceContainers(t, state)
			}
			p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs[backend] + "}"})
			first := mustExecCreated(t, p, map[string]any{"session_id": "s", "cmd": "echo old > /workspace/f"})
			assert.True(t, *first.SessionCreated, "first use")
			again := mustExecCreated(t, p, map[string]any{"session_id": "s", "cmd": "cat /workspace/f"})
			assert.False(t, *again.SessionCreated, "reuse")
			assert.Equal(t, "old\n", again.Stdout)

			var created map[string]any
			p.MustCall("box_create_session", map[string]any{"session_id": "s"}, &created)
			assert.Equal(t, false, created["session_created"], "box_create_session of an existing session")
			p.MustCall("box_create_session", map[string]any{"session_id": "c"}, &created)
			assert.Equal(t, true, created["session_created"], "box_create_session of a new one")

			var started map[string]any
			p.MustCall("box_exec_start", map[string]any{"session_id": "bg", "cmd": "true"}, &started)
			assert.Equal(t, true, started["session_created"], "box_exec_start on first use")
			p.MustCall("box_exec_start", map[string]any{"session_id": "bg", "cmd": "true"}, &started)
			assert.Equal(t, false, started["session_created"], "box_exec_start on reuse")

			var info map[string]any
			p.MustCall("box_get_session", map[string]any{"session_id": "s"}, &info)
			removeSandbox(t, backend, state, info["backend_session_id"].(string))

			var list struct {
				Sessions []map[string]any `json:"sessions"`
			}
			p.MustCall("box_get_sessions", map[string]any{}, &list)
			states := map[string]any{}
			for _, s := range list.Sessions {
				states[s["session_id"].(string)] = s["state"]
			}
			assert.Equal(t, map[string]any{"s": "lost", "c": "running", "bg": "running"}, states)
			p.MustCall("box_get_session", map[string]any{"session_id": "s"}, &info)
			assert.Equal(t, "lost", info["state"])

			after := mustExecCreated(t, p, map[string]any{"session_id": "s", "cmd": "cat /workspace/f 2>/dev/null; echo end"})
			assert.True(t, *after.SessionCreated, "the sandbox was gone: this call made a new one")
			assert.Equal(t, "end\n", after.Stdout, "a fresh workspace")
			p.MustCall("box_get_session", map[string]any{"session_id": "s"}, &info)
			assert.Equal(t, "running", info["state"])
		})
	}
}

// TestExecRecreatesARemovedSandboxWithoutAListing: box_exec alone finds
// the container removed (no listing marked it lost) and says it made the
// session again.
func TestExecRecreatesARemovedSandboxWithoutAListing(t *testing.T) {
	state := t.TempDir()
	removeInstanceContainers(t, state)
	p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + backendConfigs["docker"] + "}"})
	mustExecCreated(t, p, map[string]any{"session_id": "s", "cmd": "echo old > /workspace/f"})
	var info map[string]any
	p.MustCall("box_get_session", map[string]any{"session_id": "s"}, &info)
	removeSandbox(t, "docker", state, info["backend_session_id"].(string))
	after := mustExecCreated(t, p, map[string]any{"session_id": "s", "cmd": "cat /workspace/f 2>/dev/null; echo end"})
	assert.True(t, *after.SessionCreated)
	assert.Equal(t, "end\n", after.Stdout)
}

// removeSandbox removes a session's sandbox behind boxrt's back: the
// container (docker), the session directory (bwrap).
func removeSandbox(t *testing.T, backend, state, backendSessionID string) {
	t.Helper()
	if backend == "docker" {
		out, err := exec.Command("docker", "rm", "-f", backendSessionID).CombinedOutput()
		require.NoError(t, err, "%s", out)
		return
	}
	id, err := os.ReadFile(filepath.Join(state, "instance-id"))
	require.NoError(t, err)
	dir := filepath.Join(state, "bwrap", strings.TrimSpace(string(id)), backendSessionID)
	require.DirExists(t, dir)
	require.NoError(t, os.RemoveAll(dir))
}

// TestCallSpawnWithStateDir: an explicit --state-dir is the spawned
// runtime's, kept after it exits, and refused while a runtime holds it.
func TestCallSpawnWithStateDir(t *testing.T) {
	dir := t.TempDir()
	stdout, stderr, code := runCall(t, nil, "", "__ping", "--spawn", "--state-dir", dir)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", stdout, stderr)
	assert.FileExists(t, filepath.Join(dir, "instance-id"), "the spawned runtime used --state-dir")
	assert.FileExists(t, filepath.Join(dir, "lock"))

	server := Start(t, Options{Stdio: true, StateDir: dir})
	stdout, stderr, code = runCall(t, nil, "", "__ping", "--spawn", "--state-dir", dir)
	assert.Equal(t, 1, code, "stdout: %s", stdout)
	assert.Equal(t, "BoxRuntimeUnavailableError", decodeCallError(t, stdout).Error.Type)
	assert.Contains(t, stderr+stdout, fmt.Sprintf("in use by another boxrt (pid %d)", server.cmd.Process.Pid))
}
