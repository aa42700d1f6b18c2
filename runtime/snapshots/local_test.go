package snapshots

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/runtime/boxerr"
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
