package snapshots

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func put(t *testing.T, l *Local, data []byte) Manifest {
	t.Helper()
	m, err := l.Put(context.Background(), Manifest{SessionID: "s", Backend: "fake", Mode: ModeFilesystem, Spec: []byte(`{"image":"x"}`)}, bytes.NewReader(data))
	require.NoError(t, err)
	return m
}

func read(t *testing.T, l *Local, id string) ([]byte, error) {
	t.Helper()
	_, rc, err := l.Open(context.Background(), id)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func TestLocalStore(t *testing.T) {
	ctx := context.Background()
	random := make([]byte, 256<<10)
	_, _ = rand.Read(random)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, l *Local)
	}{
		{"round trip", func(t *testing.T, l *Local) {
			data := bytes.Repeat([]byte("hello snapshot "), 1000)
			m := put(t, l, data)
			assert.Regexp(t, `^snap-[0-9a-f]{16}$`, m.ID)
			assert.Equal(t, int64(len(data)), m.RawBytes)
			assert.Less(t, m.SizeBytes, m.RawBytes, "compressed")
			got, err := read(t, l, m.ID)
			require.NoError(t, err)
			assert.Equal(t, data, got)
			list, err := l.List(ctx)
			require.NoError(t, err)
			require.Len(t, list, 1)
			assert.Equal(t, m, list[0])
		}},
		{"corrupted archive refused", func(t *testing.T, l *Local) {
			m := put(t, l, random)
			blob, err := l.blobPath(m.Digest)
			require.NoError(t, err)
			data, err := os.ReadFile(blob)
			require.NoError(t, err)
			data[len(data)/2] ^= 0xff
			require.NoError(t, os.WriteFile(blob, data, 0o600))
			_, err = read(t, l, m.ID)
			require.ErrorIs(t, err, boxerr.ErrSnapshotCorrupted)
			var be *boxerr.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, m.ID, be.Details["snapshot_id"])
		}},
		{"truncated archive refused", func(t *testing.T, l *Local) {
			m := put(t, l, random)
			blob, _ := l.blobPath(m.Digest)
			require.NoError(t, os.Truncate(blob, m.SizeBytes/2))
			_, err := read(t, l, m.ID)
			require.ErrorIs(t, err, boxerr.ErrSnapshotCorrupted)
		}},
		{"capacity bound names the limit and leaves nothing", func(t *testing.T, l *Local) {
			l.SetMaxBytes(64 << 10)
			_, err := l.Put(ctx, Manifest{}, bytes.NewReader(random))
			require.ErrorIs(t, err, boxerr.ErrCapacityExceeded)
			var be *boxerr.Error
			require.True(t, errors.As(err, &be))
			assert.Equal(t, LimitName, be.Details["limit"])
			for _, d := range []string{"blobs/sha256", "manifests", "tmp"} {
				entries, _ := os.ReadDir(filepath.Join(l.dir, d))
				assert.Empty(t, entries, d)
			}
		}},
		{"identical archives share a blob until the last delete", func(t *testing.T, l *Local) {
			a, b := put(t, l, []byte("same")), put(t, l, []byte("same"))
			assert.NotEqual(t, a.ID, b.ID)
			assert.Equal(t, a.Digest, b.Digest)
			require.NoError(t, l.Delete(ctx, a.ID))
			got, err := read(t, l, b.ID)
			require.NoError(t, err)
			assert.Equal(t, "same", string(got))
			require.NoError(t, l.Delete(ctx, b.ID))
			blob, _ := l.blobPath(b.Digest)
			assert.NoFileExists(t, blob)
			_, err = l.Get(ctx, b.ID)
			require.ErrorIs(t, err, boxerr.ErrValidation)
		}},
		{"a tampered manifest is refused and not listed", func(t *testing.T, l *Local) {
			m := put(t, l, []byte("files"))
			path, _ := l.manifestPath(m.ID)
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			edited := bytes.Replace(data, []byte(`"image":"x"`), []byte(`"image":"x","host_path":"/etc"`), 1)
			require.NotEqual(t, data, edited)
			require.NoError(t, os.WriteFile(path, edited, 0o600))
			assertRefused(t, l, m.ID)
		}},
		{"a manifest from another store is refused", func(t *testing.T, l *Local) {
			other, err := OpenLocal(t.TempDir(), 1<<30)
			require.NoError(t, err)
			m := put(t, other, []byte("foreign"))
			for _, d := range []string{"manifests", "blobs/sha256"} {
				entries, err := os.ReadDir(filepath.Join(other.dir, d))
				require.NoError(t, err)
				for _, e := range entries {
					data, err := os.ReadFile(filepath.Join(other.dir, d, e.Name()))
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(filepath.Join(l.dir, d, e.Name()), data, 0o600))
				}
			}
			assertRefused(t, l, m.ID)
		}},
		{"a manifest that is not JSON is refused", func(t *testing.T, l *Local) {
			m := put(t, l, []byte("files"))
			path, _ := l.manifestPath(m.ID)
			require.NoError(t, os.WriteFile(path, []byte("{not json"), 0o600))
			assertRefused(t, l, m.ID)
		}},
		{"a crash's litter is gone at the next open", func(t *testing.T, l *Local) {
			m := put(t, l, []byte("kept"))
			// A kill -9 between the archive's rename and the manifest's,
			// and one mid-write.
			orphan := filepath.Join(l.dir, "blobs", "sha256", strings.Repeat("ab", 32)+".tar.zst")
			require.NoError(t, os.WriteFile(orphan, []byte("orphan"), 0o600))
			require.NoError(t, os.WriteFile(filepath.Join(l.dir, "tmp", "blob-123"), []byte("half"), 0o600))
			l2, err := OpenLocal(l.dir, 1<<30)
			require.NoError(t, err)
			assert.NoFileExists(t, orphan)
			entries, _ := os.ReadDir(filepath.Join(l.dir, "tmp"))
			assert.Empty(t, entries)
			got, err := read(t, l2, m.ID)
			require.NoError(t, err)
			assert.Equal(t, "kept", string(got))
		}},
		{"ids are checked before touching a path", func(t *testing.T, l *Local) {
			_, err := l.Get(ctx, "../../etc/passwd")
			require.ErrorIs(t, err, boxerr.ErrValidation)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := OpenLocal(t.TempDir(), 1<<30)
			require.NoError(t, err)
			tc.run(t, l)
		})
	}
}

// assertRefused checks that id is BoxSnapshotCorruptedError on Get and
// Open, is not listed, and can still be deleted.
func assertRefused(t *testing.T, l *Local, id string) {
	t.Helper()
	ctx := context.Background()
	_, err := l.Get(ctx, id)
	require.ErrorIs(t, err, boxerr.ErrSnapshotCorrupted)
	_, err = read(t, l, id)
	require.ErrorIs(t, err, boxerr.ErrSnapshotCorrupted)
	list, err := l.List(ctx)
	require.NoError(t, err)
	assert.Empty(t, list)
	require.NoError(t, l.Delete(ctx, id))
}
