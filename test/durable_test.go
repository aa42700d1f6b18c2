package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// durableBackends configure each real backend so that a session can
// "install a package" outside its workspace: docker runs the full sandbox
// image as root with a writable root filesystem (the tool goes to
// /usr/local/bin, the container's writable layer); bwrap's root is always
// read-only, so the tool goes to /home, the session's own disk.
var durableBackends = map[string]struct {
	config  string
	spec    map[string]any
	toolDir string
}{
	"docker": {
		config:  `"backend":"docker","docker":{"image":"boxrt-sandbox:latest","user":"0"}`,
		spec:    map[string]any{"read_only_rootfs": false},
		toolDir: "/usr/local/bin",
	},
	"bwrap": {config: `"backend":"bwrap"`, spec: map[string]any{}, toolDir: "/home/bin"},
}

func durableSpec(backend, id string, extra map[string]any) map[string]any {
	out := map[string]any{"session_id": id}
	for k, v := range durableBackends[backend].spec {
		out[k] = v
	}
	for k, v := range extra {
		out[k] = v
	}
	return out
}

type sessionState struct {
	SessionID        string `json:"session_id"`
	BackendSessionID string `json:"backend_session_id"`
	State            string `json:"state"`
}

// installTool writes a file into the workspace and a small executable
// outside it, standing in for an installed package.
func installTool(backend string) string {
	dir := durableBackends[backend].toolDir
	return "echo kept > /workspace/f && mkdir -p " + dir + " && printf '#!/bin/sh\\necho tool-ok\\n' > " + dir +
		"/mytool && chmod +x " + dir + "/mytool"
}

func useTool(backend string) string {
	return "cat /workspace/f && " + durableBackends[backend].toolDir + "/mytool"
}

func dockerState(t *testing.T, container string) string {
	out, err := exec.Command("docker", "inspect", "-f", "{{.State.Status}}", container).Output()
	require.NoError(t, err)
	return strings.TrimSpace(string(out))
}

// TestSuspendSurvivesKill9 writes a file and installs a tool, suspends the
// session, kills boxrt with SIGKILL, restarts it on the same state
// directory and resumes through an exec: the file and the tool are there.
func TestSuspendSurvivesKill9(t *testing.T) {
	for _, backend := range []string{"docker", "bwrap"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state)
			opts := Options{Stdio: true, StateDir: state, Config: "{" + durableBackends[backend].config + "}"}
			p := Start(t, opts)
			res := execIn(t, p, durableSpec(backend, "d1", map[string]any{"cmd": installTool(backend)}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)

			p.MustCall("box_start_managed_process", map[string]any{"session_id": "d1", "spec": map[string]any{"command": "cat"}}, nil)
			var info sessionState
			p.MustCall("box_suspend_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "suspended", info.State)
			if backend == "docker" {
				assert.Equal(t, "exited", dockerState(t, info.BackendSessionID), "a suspended container does not run")
			}
			p.Kill()

			p2 := Start(t, opts)
			p2.MustCall("box_get_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "suspended", info.State, "the restarted boxrt adopted the suspended session")
			// Concurrent calls on the suspended session: one resume.
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := p2.Call("box_exec", durableSpec(backend, "d1", map[string]any{"cmd": useTool(backend)}), 2*time.Minute)
					if assert.Nil(t, r.Error) {
						var res ExecResult
						assert.NoError(t, json.Unmarshal(r.Result, &res))
						assert.Equal(t, "kept\ntool-ok\n", res.Stdout, "%+v", res)
					}
				}()
			}
			wg.Wait()
			var st struct {
				TotalResumed int `json:"total_resumed"`
			}
			p2.MustCall("box_status", map[string]any{}, &st)
			assert.Equal(t, 1, st.TotalResumed, "four concurrent execs resumed the session once")
			var proc struct {
				Status  string `json:"status"`
				Resumed bool   `json:"resumed"`
			}
			p2.MustCall("box_get_managed_process", map[string]any{"session_id": "d1"}, &proc)
			assert.Equal(t, "running", proc.Status, "the managed process came back after the restart")
			assert.True(t, proc.Resumed, "flagged: its replay buffer starts empty")
			p2.MustCall("box_get_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "running", info.State)
			// File access resumes a suspended session too.
			p2.MustCall("box_suspend_session", map[string]any{"session_id": "d1"}, &info)
			var read struct {
				DataBase64 string `json:"data_base64"`
			}
			p2.MustCall("box_fs_read", map[string]any{"session_id": "d1", "path": "/workspace/f"}, &read)
			assert.Equal(t, "a2VwdAo=", read.DataBase64, "box_fs_read of a suspended session resumed it and read kept\\n")
			p2.MustCall("box_get_session", map[string]any{"session_id": "d1"}, &info)
			assert.Equal(t, "running", info.State)
			// A suspended session is deleted like any other.
			p2.MustCall("box_suspend_session", map[string]any{"session_id": "d1"}, &info)
			p2.MustCall("box_delete_session", map[string]any{"session_id": "d1"}, nil)
			assert.Equal(t, 0, sandboxesLeft(t, backend, state))
			entries, _ := os.ReadDir(filepath.Join(state, "suspended"))
			assert.Empty(t, entries, "no suspend record is left")
		})
	}
}

// treeSum is a checksum over the workspace's paths and file contents.
const treeSum = "cd /workspace && (find . | sort; find . -type f | sort | xargs md5sum) | md5sum"

type snapshotInfo struct {
	SnapshotID string `json:"snapshot_id"`
	SessionID  string `json:"session_id"`
	Backend    string `json:"backend"`
	Mode       string `json:"mode"`
	Digest     string `json:"digest"`
	SizeBytes  int64  `json:"size_bytes"`
}

// TestSnapshotRestoreFork snapshots a session, deletes it, restores it
// under a new id (same tree checksum, installed tool works), forks the
// restored session (the two diverge), refuses a corrupted snapshot with a
// typed error and leaves no session behind, and answers mode full with the
// reason.
func TestSnapshotRestoreFork(t *testing.T) {
	for _, backend := range []string{"docker", "bwrap"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state)
			p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + durableBackends[backend].config + "}"})
			setup := installTool(backend) + " && mkdir -p /workspace/a/b && head -c 200000 /dev/urandom > /workspace/a/b/blob" +
				" && ln -s a/b/blob /workspace/link && echo x > /workspace/a/small"
			res := execIn(t, p, durableSpec(backend, "src", map[string]any{"cmd": setup + " && " + treeSum}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)
			sum := res.Stdout

			var snap snapshotInfo
			p.MustCall("box_snapshot_session", map[string]any{"session_id": "src", "mode": "filesystem"}, &snap)
			assert.Regexp(t, `^snap-[0-9a-f]{16}$`, snap.SnapshotID)
			assert.Equal(t, backend, snap.Backend)
			var list struct {
				Snapshots []snapshotInfo `json:"snapshots"`
			}
			p.MustCall("box_list_snapshots", map[string]any{}, &list)
			require.Len(t, list.Snapshots, 1)
			assert.Equal(t, snap, list.Snapshots[0])
			p.MustCall("box_delete_session", map[string]any{"session_id": "src"}, nil)

			var restored sessionState
			p.MustCall("box_create_session", map[string]any{"session_id": "r1", "from_snapshot": snap.SnapshotID}, &restored)
			res = execIn(t, p, durableSpec(backend, "r1", map[string]any{"cmd": treeSum + " && " + useTool(backend)}))
			assert.Equal(t, sum+"kept\ntool-ok\n", res.Stdout, "same tree, tool still installed: %+v", res)

			var forked sessionState
			p.MustCall("box_fork_session", map[string]any{"session_id": "r1", "new_session_id": "f1"}, &forked)
			assert.Equal(t, "f1", forked.SessionID)
			assert.NotEqual(t, restored.BackendSessionID, forked.BackendSessionID)
			res = execIn(t, p, durableSpec(backend, "f1", map[string]any{"cmd": treeSum + " && echo fork > /workspace/only-fork && rm /workspace/a/small"}))
			assert.Equal(t, sum, res.Stdout, "the fork starts with the same tree")
			execIn(t, p, durableSpec(backend, "r1", map[string]any{"cmd": "echo orig > /workspace/only-orig"}))
			res = execIn(t, p, durableSpec(backend, "r1", map[string]any{"cmd": "ls /workspace; cat /workspace/a/small"}))
			assert.Equal(t, "a\nf\nlink\nonly-orig\nx\n", res.Stdout, "the source does not see the fork's changes")
			res = execIn(t, p, durableSpec(backend, "f1", map[string]any{"cmd": "ls /workspace"}))
			assert.Equal(t, "a\nf\nlink\nonly-fork\n", res.Stdout, "the fork does not see the source's changes")

			// A flipped byte in the stored archive: refused, typed, no session left.
			blobs, err := filepath.Glob(filepath.Join(state, "snapshots", "blobs", "sha256", "*.tar.zst"))
			require.NoError(t, err)
			require.Len(t, blobs, 1)
			data, err := os.ReadFile(blobs[0])
			require.NoError(t, err)
			data[len(data)/2] ^= 0x55
			require.NoError(t, os.WriteFile(blobs[0], data, 0o600))
			r := p.Call("box_create_session", map[string]any{"session_id": "c1", "from_snapshot": snap.SnapshotID}, 2*time.Minute)
			require.NotNil(t, r.Error)
			assert.Equal(t, "BoxSnapshotCorruptedError", r.Error.Type(), "%+v", r.Error)
			r = p.Call("box_get_session", map[string]any{"session_id": "c1"}, time.Minute)
			require.NotNil(t, r.Error, "no session is left from a refused restore")

			r = p.Call("box_snapshot_session", map[string]any{"session_id": "r1", "mode": "full"}, time.Minute)
			require.NotNil(t, r.Error)
			assert.Contains(t, []any{"criu_unavailable", "not_implemented"}, r.Error.Data["reason"], "%+v", r.Error)

			p.MustCall("box_delete_snapshot", map[string]any{"snapshot_id": snap.SnapshotID}, nil)
			r = p.Call("box_get_snapshot", map[string]any{"snapshot_id": snap.SnapshotID}, time.Minute)
			require.NotNil(t, r.Error)
			assert.Equal(t, "BoxValidationError", r.Error.Type())
			p.MustCall("box_delete_session", map[string]any{"session_id": "r1"}, nil)
			p.MustCall("box_delete_session", map[string]any{"session_id": "f1"}, nil)
		})
	}
}

type poolStatus struct {
	Pools []struct {
		Name  string `json:"name"`
		Ready int    `json:"ready"`
	} `json:"pools"`
	PoolHits   int `json:"total_pool_hits"`
	PoolMisses int `json:"total_pool_misses"`
}

func waitPoolReady(t *testing.T, p *Proc, n int) poolStatus {
	t.Helper()
	var st poolStatus
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		p.MustCall("box_status", map[string]any{}, &st)
		if len(st.Pools) == 1 && st.Pools[0].Ready == n {
			return st
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("pool never had %d ready: %+v", n, st)
	return st
}

// sandboxesLeft counts this installation's sandboxes: containers for
// docker, session directories for bwrap.
func sandboxesLeft(t *testing.T, backend, state string) int {
	id := instanceIDOf(t, state)
	if backend == "docker" {
		return len(managedContainers(t, "boxrt.instance="+id))
	}
	entries, _ := os.ReadDir(filepath.Join(state, "bwrap", id))
	n := 0
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(state, "bwrap", id, e.Name(), "session.json")); err == nil {
			n++
		}
	}
	return n
}

func instanceIDOf(t *testing.T, state string) string {
	id, err := os.ReadFile(filepath.Join(state, "instance-id"))
	require.NoError(t, err)
	return strings.TrimSpace(string(id))
}

// TestWarmPool: a pool of 3 serves three new sessions and the fourth is
// created cold (the refill waits a minute); a graceful exit leaves no
// sandbox; after a kill -9 the next start removes the orphaned pooled
// sandboxes and refills, and its exit again leaves none.
func TestWarmPool(t *testing.T) {
	for _, backend := range []string{"docker", "bwrap"} {
		t.Run(backend, func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state)
			cfg := "{" + backendConfigs[backend] + `,"durable":{"pools":[{"name":"warm","size":3,"refill_interval_ms":60000}]}}`
			if backend == "docker" {
				cfg = "{" + backendConfigs[backend] + `,"durable":{"pools":[{"name":"warm","size":3,"refill_interval_ms":60000,"sandbox":{"image":"boxrt-test:busybox"}}]}}`
			}
			opts := Options{Stdio: true, StateDir: state, Config: cfg}
			p := Start(t, opts)
			waitPoolReady(t, p, 3)
			for i := 1; i <= 4; i++ {
				id := fmt.Sprintf("s%d", i)
				res := execIn(t, p, map[string]any{"session_id": id, "cmd": "echo " + id})
				assert.Equal(t, id+"\n", res.Stdout)
			}
			var st poolStatus
			p.MustCall("box_status", map[string]any{}, &st)
			assert.Equal(t, 3, st.PoolHits, "three sessions came from the pool")
			assert.Equal(t, 1, st.PoolMisses, "the fourth was created cold")
			assert.Equal(t, 0, st.Pools[0].Ready)
			var sessions struct {
				Sessions []sessionState `json:"sessions"`
			}
			p.MustCall("box_get_sessions", map[string]any{}, &sessions)
			assert.Len(t, sessions.Sessions, 4, "pooled sandboxes are not listed as sessions")
			p.Stop()
			assert.Equal(t, 0, sandboxesLeft(t, backend, state), "a graceful exit leaves no sandbox")

			p2 := Start(t, opts)
			waitPoolReady(t, p2, 3)
			p2.Kill()
			assert.Equal(t, 3, sandboxesLeft(t, backend, state), "kill -9 leaves the pool behind")
			p3 := Start(t, opts)
			waitPoolReady(t, p3, 3)
			assert.Equal(t, 3, sandboxesLeft(t, backend, state), "the orphaned pool was removed, the new one filled")
			p3.Stop()
			assert.Equal(t, 0, sandboxesLeft(t, backend, state))
		})
	}
}
