package runtime

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/snapshots"
)

// archiveFake keeps one file per sandbox and archives it as workspace/f.
type archiveFake struct {
	*fakeBackend
	mu      sync.Mutex
	content map[string]string // backend session id → workspace/f
	exports []backends.ExportOptions
}

func (f *archiveFake) ExportFiles(_ context.Context, info backends.Session, opts backends.ExportOptions, w io.Writer) error {
	f.mu.Lock()
	data := f.content[info.BackendSessionID]
	f.exports = append(f.exports, opts)
	f.mu.Unlock()
	tw := tar.NewWriter(w)
	if err := tw.WriteHeader(&tar.Header{Name: backends.ArchiveWorkspace + "f", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.WriteString(tw, data); err != nil {
		return err
	}
	return tw.Close()
}

func (f *archiveFake) ImportFiles(_ context.Context, info backends.Session, r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if hdr.Name == backends.ArchiveWorkspace+"f" {
			f.mu.Lock()
			f.content[info.BackendSessionID] = string(data)
			f.mu.Unlock()
		}
	}
}

func TestSnapshotRestoreAndFork(t *testing.T) {
	ctx := context.Background()
	af := &archiveFake{fakeBackend: newFake(), content: map[string]string{}}
	store, err := snapshots.OpenLocal(t.TempDir(), 1<<30)
	require.NoError(t, err)
	rt2, err := New(DefaultConfig(), func(string, Config, string, string) (backends.Backend, error) { return af, nil },
		t.TempDir(), WithSnapshotStore(store))
	require.NoError(t, err)
	rt2.Start(ctx)
	t.Cleanup(func() { _ = rt2.Close(ctx) })

	src := spec("src")
	src.MemoryMB = 256
	info, err := rt2.EnsureSession(ctx, src)
	require.NoError(t, err)
	af.content[info.BackendSessionID] = "hello"

	m, err := rt2.Snapshots().Take(ctx, "src", "")
	require.NoError(t, err)
	assert.Equal(t, snapshots.ModeFilesystem, m.Mode)
	var sb backends.Sandbox
	require.NoError(t, json.Unmarshal(m.Spec, &sb))
	assert.Equal(t, 256, sb.MemoryMB)
	require.NoError(t, rt2.DeleteSession(ctx, "src"))

	restored := spec("r")
	restored.FromSnapshot = m.ID
	rinfo, err := rt2.EnsureSession(ctx, restored)
	require.NoError(t, err)
	assert.Equal(t, 256, rinfo.MemoryMB, "the snapshot's sandbox fields win")
	assert.Equal(t, "hello", af.content[rinfo.BackendSessionID])

	finfo, err := rt2.Snapshots().Fork(ctx, "r", "f")
	require.NoError(t, err)
	assert.NotEqual(t, rinfo.BackendSessionID, finfo.BackendSessionID)
	assert.Equal(t, "hello", af.content[finfo.BackendSessionID])
	_, err = rt2.Snapshots().Fork(ctx, "r", "f")
	require.ErrorIs(t, err, boxerr.ErrValidation, "the fork's id exists")

	bad := spec("x")
	bad.FromSnapshot = "snap-0000000000000000"
	_, err = rt2.EnsureSession(ctx, bad)
	require.ErrorIs(t, err, boxerr.ErrValidation)
	_, err = rt2.Snapshots().Take(ctx, "r", "memory")
	require.ErrorIs(t, err, boxerr.ErrValidation)
	for _, o := range af.exports {
		assert.False(t, o.HostPaths, "host paths are not copied by default")
	}
}
