package test

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends/backendtest"
)

// hostTree describes a host directory (names, file contents, modes) so a
// test can tell it did not change.
func hostTree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		desc := fmt.Sprintf("%s:%o:%s", rel, fi.Mode(), ownerOf(fi))
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			desc += "=" + string(data)
		}
		out = append(out, desc)
		return nil
	})
	require.NoError(t, err)
	return strings.Join(out, " ")
}

func ownerOf(fi os.FileInfo) string {
	out, _ := json.Marshal(fi.Sys())
	var st struct{ Uid, Gid uint32 }
	_ = json.Unmarshal(out, &st)
	return fmt.Sprintf("%d.%d", st.Uid, st.Gid)
}

// archiveNames lists the entry names of a stored snapshot's archive.
func archiveNames(t *testing.T, state, id string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(state, "snapshots", "manifests", id+".json"))
	require.NoError(t, err)
	var m struct {
		Digest string `json:"digest"`
	}
	require.NoError(t, json.Unmarshal(data, &m))
	f, err := os.Open(filepath.Join(state, "snapshots", "blobs", "sha256", strings.TrimPrefix(m.Digest, "sha256:")+".tar.zst"))
	require.NoError(t, err)
	defer f.Close()
	dec, err := zstd.NewReader(f)
	require.NoError(t, err)
	defer dec.Close()
	var names []string
	tr := tar.NewReader(dec)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		require.NoError(t, err)
		names = append(names, hdr.Name)
	}
}

// TestSnapshotAfterSymlinkSwap reproduces the attack of issue 35: with
// durable.snapshot_host_paths, session a (whose workspace is the parent of
// b's) swaps b's host directory for a symlink to a root-only host
// directory holding a secret; a fork and a snapshot of b must not contain
// the secret (each either copies what b itself mounts, or refuses with a
// typed error). An extra mount inside the workspace is never in a
// snapshot, and restoring one leaves its host directory as it was; that
// snapshot's manifest edited to bind the secret directory is refused.
func TestSnapshotAfterSymlinkSwap(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			root, extra := backendtest.ReachableDir(t), backendtest.ReachableDir(t)
			require.NoError(t, os.WriteFile(filepath.Join(extra, "extra-file"), []byte("host data"), 0o644))
			secret := filepath.Join(t.TempDir(), "keys")
			require.NoError(t, os.Mkdir(secret, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(secret, "API_KEY"), []byte("sk-live-secret"), 0o600))
			for _, d := range []string{"b"} {
				require.NoError(t, os.Mkdir(filepath.Join(root, d), 0o777))
				require.NoError(t, os.Chmod(filepath.Join(root, d), 0o777))
			}
			secretBefore, extraBefore := hostTree(t, secret), hostTree(t, extra)
			state := t.TempDir()
			removeInstanceContainers(t, state)
			p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + durableBackends[backend].config +
				fmt.Sprintf(`,"local":{"allowed_mount_roots":[%q,%q]},"durable":{"snapshot_host_paths":true}}`, root, extra)})

			res := execIn(t, p, durableSpec(backend, "b", map[string]any{"host_path": filepath.Join(root, "b"), "cmd": "echo mine > /workspace/mine"}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)
			res = execIn(t, p, durableSpec(backend, "a", map[string]any{"host_path": root,
				"cmd": "mv /workspace/b /workspace/b.old && ln -s " + secret + " /workspace/b"}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)
			target, err := os.Readlink(filepath.Join(root, "b"))
			require.NoError(t, err, "session a swapped b's directory for a symlink")
			require.Equal(t, secret, target)

			noSecret := func(what, session string) {
				res := execIn(t, p, durableSpec(backend, session, map[string]any{"cmd": "cat /workspace/API_KEY 2>/dev/null; ls -A /workspace"}))
				assert.NotContains(t, res.Stdout, "sk-live-secret", "%s holds the host's secret", what)
				assert.NotContains(t, res.Stdout, "API_KEY", "%s holds the host's secret directory", what)
			}
			refusedOr := func(r Response, what string, then func()) {
				if r.Error != nil {
					assert.Equal(t, "BoxValidationError", r.Error.Type(), "%s: %+v", what, r.Error)
					assert.Contains(t, r.Error.Message, "not a plain directory", "%s: %+v", what, r.Error)
					return
				}
				then()
			}
			r := p.Call("box_fork_session", map[string]any{"session_id": "b", "new_session_id": "f"}, 2*time.Minute)
			refusedOr(r, "fork", func() { noSecret("the fork", "f") })

			r = p.Call("box_snapshot_session", map[string]any{"session_id": "b"}, 2*time.Minute)
			refusedOr(r, "snapshot", func() {
				var snap snapshotInfo
				require.NoError(t, json.Unmarshal(r.Result, &snap))
				for _, n := range archiveNames(t, state, snap.SnapshotID) {
					assert.NotContains(t, n, "API_KEY")
				}
				p.MustCall("box_create_session", map[string]any{"session_id": "r", "from_snapshot": snap.SnapshotID}, nil)
				noSecret("the restored snapshot", "r")
			})

			// An extra mount inside the workspace: the engine would archive
			// (and restore into) the host directory it binds there.
			mounts := []map[string]any{{"host_path": extra, "mount_path": "/workspace/data", "mode": "rw"}}
			res = execIn(t, p, durableSpec(backend, "c", map[string]any{"cmd": "echo own > /workspace/own", "extra_mounts": mounts}))
			require.Equal(t, 0, *res.ExitCode, "%+v", res)
			var snap snapshotInfo
			p.MustCall("box_snapshot_session", map[string]any{"session_id": "c"}, &snap)
			names := archiveNames(t, state, snap.SnapshotID)
			assert.Contains(t, names, "workspace/own")
			for _, n := range names {
				assert.NotContains(t, n, "extra-file", "an extra mount's file is in the snapshot")
			}
			p.MustCall("box_create_session", map[string]any{"session_id": "c2", "from_snapshot": snap.SnapshotID}, nil)
			res = execIn(t, p, durableSpec(backend, "c2", map[string]any{"cmd": "cat /workspace/own /workspace/data/extra-file", "extra_mounts": mounts}))
			assert.Equal(t, "own\nhost data", res.Stdout, "%+v", res)

			// The same snapshot's manifest edited to bind the secret
			// directory: refused (its seal no longer matches), not listed.
			manifest := filepath.Join(state, "snapshots", "manifests", snap.SnapshotID+".json")
			data, err := os.ReadFile(manifest)
			require.NoError(t, err)
			edited := strings.Replace(string(data), `"host_path":""`, `"host_path":"`+secret+`"`, 1)
			require.NotEqual(t, string(data), edited)
			require.NoError(t, os.WriteFile(manifest, []byte(edited), 0o600))
			r = p.Call("box_create_session", map[string]any{"session_id": "t", "from_snapshot": snap.SnapshotID}, 2*time.Minute)
			require.NotNil(t, r.Error, "a tampered manifest was restored")
			assert.Equal(t, "BoxSnapshotCorruptedError", r.Error.Type(), "%+v", r.Error)
			var list struct {
				Snapshots []snapshotInfo `json:"snapshots"`
			}
			p.MustCall("box_list_snapshots", map[string]any{}, &list)
			for _, s := range list.Snapshots {
				assert.NotEqual(t, snap.SnapshotID, s.SnapshotID, "a tampered snapshot is listed")
			}

			p.Stop()
			assert.Equal(t, secretBefore, hostTree(t, secret), "the root-only host directory changed")
			assert.Equal(t, extraBefore, hostTree(t, extra), "the extra mount's host directory changed")
		})
	}
}

// storeLitter lists what a snapshot store holds besides its key, its
// manifests and the archives they name: temp files and orphan archives.
func storeLitter(t *testing.T, store string) []string {
	t.Helper()
	var litter []string
	tmp, _ := os.ReadDir(filepath.Join(store, "tmp"))
	for _, e := range tmp {
		litter = append(litter, "tmp/"+e.Name())
	}
	named := map[string]bool{}
	manifests, _ := os.ReadDir(filepath.Join(store, "manifests"))
	for _, e := range manifests {
		data, err := os.ReadFile(filepath.Join(store, "manifests", e.Name()))
		require.NoError(t, err)
		var m struct {
			Digest string `json:"digest"`
		}
		if json.Unmarshal(data, &m) == nil {
			named[strings.TrimPrefix(m.Digest, "sha256:")+".tar.zst"] = true
		}
	}
	blobs, _ := os.ReadDir(filepath.Join(store, "blobs", "sha256"))
	for _, e := range blobs {
		if !named[e.Name()] {
			litter = append(litter, "blobs/sha256/"+e.Name())
		}
	}
	return litter
}

// TestSnapshotKill9 kills boxrt with SIGKILL while a snapshot is being
// written: the restarted boxrt leaves no temp file or orphan archive in
// the store (before any snapshot call), lists no snapshot it cannot
// restore, and snapshots again.
func TestSnapshotKill9(t *testing.T) {
	state := t.TempDir()
	opts := Options{Stdio: true, StateDir: state, Config: "{" + durableBackends["bwrap"].config + "}"}
	p := Start(t, opts)
	res := execIn(t, p, durableSpec("bwrap", "src", map[string]any{"cmd": "echo kept > /workspace/f && head -c 120000000 /dev/urandom > /workspace/big"}))
	require.Equal(t, 0, *res.ExitCode, "%+v", res)
	var first snapshotInfo
	p.MustCall("box_snapshot_session", map[string]any{"session_id": "src"}, &first)

	p.Send([]byte(`{"jsonrpc":"2.0","id":"snap","method":"box_snapshot_session","params":{"session_id":"src"}}` + "\n"))
	tmpDir := filepath.Join(state, "snapshots", "tmp")
	deadline := time.Now().Add(time.Minute)
	caught := false
	for !caught && time.Now().Before(deadline) {
		entries, _ := os.ReadDir(tmpDir)
		for _, e := range entries {
			if fi, err := e.Info(); err == nil && strings.HasPrefix(e.Name(), "blob-") && fi.Size() > 1<<20 {
				caught = true
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	require.True(t, caught, "no snapshot was being written to kill")
	p.Kill()
	require.NotEmpty(t, storeLitter(t, filepath.Join(state, "snapshots")), "the kill left a half-written archive (else it came too late to test anything)")

	p2 := Start(t, opts)
	p2.MustCall("box_status", map[string]any{}, nil)
	assert.Empty(t, storeLitter(t, filepath.Join(state, "snapshots")), "the restarted boxrt removed what the kill left")
	var list struct {
		Snapshots []snapshotInfo `json:"snapshots"`
	}
	p2.MustCall("box_list_snapshots", map[string]any{}, &list)
	require.Len(t, list.Snapshots, 1, "only the finished snapshot is listed")
	assert.Equal(t, first.SnapshotID, list.Snapshots[0].SnapshotID)
	for i, s := range list.Snapshots {
		id := fmt.Sprintf("r%d", i)
		p2.MustCall("box_create_session", map[string]any{"session_id": id, "from_snapshot": s.SnapshotID}, nil)
		res := execIn(t, p2, map[string]any{"session_id": id, "cmd": "cat /workspace/f"})
		assert.Equal(t, "kept\n", res.Stdout, "%+v", res)
	}
	var again snapshotInfo
	p2.MustCall("box_snapshot_session", map[string]any{"session_id": "r0"}, &again)
	assert.Empty(t, storeLitter(t, filepath.Join(state, "snapshots")))
}

// TestSnapshotDiskFull puts the state directory's snapshot store on an
// 8 MiB loop-mounted ext4 filesystem and snapshots more than fits: a typed
// error saying the disk is full, nothing half-written left or listed, and
// boxrt goes on serving (a smaller snapshot then succeeds and restores).
func TestSnapshotDiskFull(t *testing.T) {
	state := t.TempDir()
	store := filepath.Join(state, "snapshots")
	require.NoError(t, os.Mkdir(store, 0o700))
	img := filepath.Join(t.TempDir(), "store.img")
	for _, cmd := range [][]string{{"truncate", "-s", "8M", img}, {"mkfs.ext4", "-q", "-F", img}, {"mount", "-o", "loop", img, store}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput()
		require.NoError(t, err, "%v: %s", cmd, out)
	}
	// Registered before Start: cleanups run last-in first-out, so boxrt
	// has stopped when the filesystem is unmounted (and its loop device
	// detached).
	t.Cleanup(func() {
		if out, err := exec.Command("umount", store).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", store, err, out)
		}
	})
	p := Start(t, Options{Stdio: true, StateDir: state, Config: "{" + durableBackends["bwrap"].config + "}"})
	res := execIn(t, p, durableSpec("bwrap", "s", map[string]any{"cmd": "echo kept > /workspace/f && head -c 20000000 /dev/urandom > /workspace/big"}))
	require.Equal(t, 0, *res.ExitCode, "%+v", res)

	r := p.Call("box_snapshot_session", map[string]any{"session_id": "s"}, 2*time.Minute)
	require.NotNil(t, r.Error, "a 20 MB snapshot fit on an 8 MiB filesystem")
	assert.Equal(t, "BoxError", r.Error.Type(), "%+v", r.Error)
	assert.Equal(t, "disk_full", r.Error.Data["reason"], "%+v", r.Error)
	assert.Contains(t, r.Error.Message, "full", "%+v", r.Error)
	assert.Empty(t, storeLitter(t, store))
	var list struct {
		Snapshots []snapshotInfo `json:"snapshots"`
	}
	p.MustCall("box_list_snapshots", map[string]any{}, &list)
	assert.Empty(t, list.Snapshots, "nothing half-written is listed")

	res = execIn(t, p, map[string]any{"session_id": "s", "cmd": "rm /workspace/big && cat /workspace/f"})
	assert.Equal(t, "kept\n", res.Stdout, "boxrt still serves the session: %+v", res)
	var snap snapshotInfo
	p.MustCall("box_snapshot_session", map[string]any{"session_id": "s"}, &snap)
	p.MustCall("box_create_session", map[string]any{"session_id": "r", "from_snapshot": snap.SnapshotID}, nil)
	res = execIn(t, p, map[string]any{"session_id": "r", "cmd": "cat /workspace/f"})
	assert.Equal(t, "kept\n", res.Stdout, "%+v", res)
}
