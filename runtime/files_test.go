package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// fakeFiles is a fake backend with a file API: one file, whose read
// blocks until release is closed.
type fakeFiles struct {
	*fakeBackend
	release chan struct{}
	paths   []string
}

func (f *fakeFiles) StatFile(_ context.Context, _ backends.Session, p string) (backends.FileInfo, error) {
	f.paths = append(f.paths, p)
	return backends.FileInfo{Path: p, Type: backends.FileTypeFile}, nil
}

func (f *fakeFiles) ListFiles(_ context.Context, _ backends.Session, dir string, _, limit int) ([]backends.FileInfo, error) {
	var out []backends.FileInfo
	for i := 0; i < limit; i++ {
		// A permutation of 0..limit-1 (7919 is prime to the limits used).
		out = append(out, backends.FileInfo{Path: fmt.Sprintf("%s/%05d", dir, i*7919%limit)})
	}
	return out, nil
}

func (f *fakeFiles) ReadFile(_ context.Context, _ backends.Session, p string, _, _ int64) (io.ReadCloser, backends.FileInfo, error) {
	<-f.release
	return io.NopCloser(strings.NewReader("data")), backends.FileInfo{Path: p, Size: 4}, nil
}

func (f *fakeFiles) WriteFile(context.Context, backends.Session, string, io.Reader, backends.WriteOptions) (int64, error) {
	return 0, nil
}
func (f *fakeFiles) RemoveFile(context.Context, backends.Session, string, bool) error { return nil }
func (f *fakeFiles) MakeDir(context.Context, backends.Session, string) error          { return nil }
func (f *fakeFiles) RenameFile(context.Context, backends.Session, string, string) error {
	return nil
}

func TestFilesNeedASessionAndABackendWithAFileAPI(t *testing.T) {
	ctx := context.Background()
	plain, _ := newTestRuntime(t, newFake(), "")
	_, err := plain.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		rt   *Runtime
		id   string
		path string
		kind *boxerr.Kind
	}{
		{"backend without a file API", plain, "s", "/workspace/a", boxerr.ErrBox},
		{"unknown session", plain, "nope", "/workspace/a", boxerr.ErrSessionNotFound},
		{"relative path", plain, "s", "workspace/a", boxerr.ErrValidation},
		{"NUL in the path", plain, "s", "/workspace/\x00", boxerr.ErrValidation},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.rt.Files().Stat(ctx, tc.id, tc.path)
			assert.True(t, errors.Is(err, tc.kind), "want %s, got %v", tc.kind.Type, err)
		})
	}
	_, _, err = plain.Files().List(ctx, "s", "/workspace", 0)
	assert.True(t, errors.Is(err, boxerr.ErrValidation))
	_, err = plain.Files().Write(ctx, "s", "/workspace/a", strings.NewReader(""), backends.WriteOptions{Mode: 0o4755})
	assert.True(t, errors.Is(err, boxerr.ErrValidation))
}

func TestFilesPathsCleanedListSortedAndCut(t *testing.T) {
	ctx := context.Background()
	ff := &fakeFiles{fakeBackend: newFake(), release: make(chan struct{})}
	rt, _ := newTestRuntime(t, ff, "")
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	_, err = rt.Files().Stat(ctx, "s", "/workspace/./a/../b//c")
	require.NoError(t, err)
	assert.Equal(t, []string{"/workspace/b/c"}, ff.paths)
	entries, cut, err := rt.Files().List(ctx, "s", "/workspace", 3)
	require.NoError(t, err)
	assert.True(t, cut)
	assert.Len(t, entries, MaxListEntries)
	assert.IsIncreasing(t, pathsOf(entries))
}

func pathsOf(entries []backends.FileInfo) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Path)
	}
	return out
}

// A session whose file is being read is not reaped, and counts as used.
func TestFileReadKeepsTheSessionFromTheReaper(t *testing.T) {
	ctx := context.Background()
	ff := &fakeFiles{fakeBackend: newFake(), release: make(chan struct{})}
	rt, clock := newTestRuntime(t, ff, `{"limits":{"session_ttl_sec":60}}`)
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	opened := make(chan io.ReadCloser)
	go func() {
		rc, _, err := rt.Files().Read(ctx, "s", "/workspace/a", 0, -1)
		assert.NoError(t, err)
		opened <- rc
	}()
	require.Eventually(t, func() bool {
		return rt.sessions.busy(rt.sessions.get("s"))
	}, 5*time.Second, time.Millisecond)
	clock.Advance(2 * time.Minute)
	assert.Equal(t, 0, rt.Reap(ctx), "a session in a file call is not reaped")
	close(ff.release)
	rc := <-opened
	clock.Advance(2 * time.Minute)
	assert.Equal(t, 0, rt.Reap(ctx), "an open download keeps the session")
	require.NoError(t, rc.Close())
	clock.Advance(2 * time.Minute)
	assert.Equal(t, 1, rt.Reap(ctx), "idle again once the reader is closed")
}

func TestWatchRefusesATreeItCannotListWhole(t *testing.T) {
	ctx := context.Background()
	ff := &fakeFiles{fakeBackend: newFake(), release: make(chan struct{})}
	rt, _ := newTestRuntime(t, ff, "")
	_, err := rt.EnsureSession(ctx, spec("s"))
	require.NoError(t, err)
	_, err = rt.Files().Watch(ctx, "s", "/workspace", 2)
	assert.True(t, errors.Is(err, boxerr.ErrValidation), "%v", err)
}
