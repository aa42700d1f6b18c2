package backends

import (
	"errors"
	"io/fs"
	"os"
	"syscall"
	"testing"
	"time"
)

// fakeInfo is an fs.FileInfo of the given mode.
type fakeInfo fs.FileMode

func (m fakeInfo) Name() string       { return "x" }
func (m fakeInfo) Size() int64        { return 0 }
func (m fakeInfo) Mode() fs.FileMode  { return fs.FileMode(m) }
func (m fakeInfo) ModTime() time.Time { return time.Time{} }
func (m fakeInfo) IsDir() bool        { return fs.FileMode(m).IsDir() }
func (m fakeInfo) Sys() any           { return nil }

// TestResolveInMountsSwappedLink: a component that was a symlink at the
// lstat and is something else at the readlink (sandboxed code swapping it)
// is looked at again, not reported as an untyped failure.
func TestResolveInMountsSwappedLink(t *testing.T) {
	mounts := []FileMount{{Path: "/workspace"}}
	for _, sc := range []struct {
		name     string
		readErr  error
		thenMode fs.FileMode // what the second lstat sees; 0: gone
		want     string
	}{
		{"a link replaced by a directory", &os.PathError{Op: "readlinkat", Path: "d", Err: syscall.EINVAL}, fs.ModeDir, "d/f"},
		{"a link removed", &os.PathError{Op: "readlinkat", Path: "d", Err: syscall.ENOENT}, 0, "d/f"},
	} {
		t.Run(sc.name, func(t *testing.T) {
			lstats := 0
			look := MountLookup{
				Lstat: func(_ int, rel string) (fs.FileInfo, error) {
					if rel != "d" {
						return fakeInfo(fs.ModeDir), nil // the mount's root
					}
					if lstats++; lstats == 1 {
						return fakeInfo(fs.ModeSymlink), nil
					}
					if sc.thenMode == 0 {
						return nil, fs.ErrNotExist
					}
					return fakeInfo(sc.thenMode), nil
				},
				Readlink: func(int, string) (string, error) { return "", sc.readErr },
			}
			i, rel, _, err := ResolveInMounts(mounts, "path", "/workspace/d/f", true, look)
			if err != nil || i != 0 || rel != sc.want {
				t.Fatalf("got mount %d rel %q err %v, want %q", i, rel, err, sc.want)
			}
			if lstats != 2 {
				t.Fatalf("lstat ran %d times, want a second look", lstats)
			}
		})
	}
	t.Run("a link that keeps changing ends in a typed error", func(t *testing.T) {
		look := MountLookup{
			Lstat: func(_ int, rel string) (fs.FileInfo, error) {
				if rel != "d" {
					return fakeInfo(fs.ModeDir), nil
				}
				return fakeInfo(fs.ModeSymlink), nil
			},
			Readlink: func(int, string) (string, error) { return "", syscall.EINVAL },
		}
		_, _, _, err := ResolveInMounts(mounts, "path", "/workspace/d/f", true, look)
		var errno syscall.Errno
		if err == nil || errors.As(err, &errno) {
			t.Fatalf("got %v, want a validation error", err)
		}
	})
}
