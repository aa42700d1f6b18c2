package docker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends/internal/loopdisk"
)

// TestRemoveQuota: deleting a session's quota filesystem unmounts whatever
// is mounted on its mount point, even a mount a device comparison cannot
// see, and never deletes what lies below a mount or what it does not know.
// Real mounts: it needs root, as the backend does.
func TestRemoveQuota(t *testing.T) {
	const name = "boxrt-quota-test-0123abcd"
	tests := []struct {
		name string
		// setup prepares the session's directory and returns a check of
		// what must survive the removal.
		setup   func(t *testing.T, b *Backend, dir, mnt string) func(t *testing.T)
		wantErr bool
	}{
		{"a loop-mounted workspace with files", func(t *testing.T, b *Backend, dir, mnt string) func(t *testing.T) {
			img := filepath.Join(dir, quotaImage)
			mustNoErr(t, os.MkdirAll(mnt, 0o700))
			mkfs, err := loopdisk.Mkfs()
			mustNoErr(t, err)
			mustNoErr(t, loopdisk.Format(context.Background(), mkfs, img, MinWorkspaceQuotaMB, ""))
			mustNoErr(t, b.mountQuota(name))
			mustNoErr(t, os.WriteFile(filepath.Join(mnt, "work"), []byte("x"), 0o600))
			return func(t *testing.T) {
				if loops := LoopDevicesOf(img); len(loops) > 0 {
					t.Errorf("loop devices left: %v", loops)
				}
			}
		}, false},
		{"a mount on the same filesystem, which a device check misses", func(t *testing.T, _ *Backend, dir, mnt string) func(t *testing.T) {
			src := t.TempDir()
			mustNoErr(t, os.WriteFile(filepath.Join(src, "keep"), []byte("session data"), 0o600))
			mustNoErr(t, os.MkdirAll(mnt, 0o700))
			mustNoErr(t, os.WriteFile(filepath.Join(dir, quotaImage), nil, 0o600))
			mustNoErr(t, unix.Mount(src, mnt, "", unix.MS_BIND, ""))
			unmountAtCleanup(t, mnt)
			return func(t *testing.T) {
				if b, err := os.ReadFile(filepath.Join(src, "keep")); err != nil || string(b) != "session data" {
					t.Errorf("a file below the mount was touched: %q, %v", b, err)
				}
			}
		}, false},
		{"leftovers with nothing mounted", func(t *testing.T, _ *Backend, dir, mnt string) func(t *testing.T) {
			mustNoErr(t, os.MkdirAll(mnt, 0o700))
			mustNoErr(t, os.WriteFile(filepath.Join(dir, quotaImage), nil, 0o600))
			return func(*testing.T) {}
		}, false},
		{"nothing there", func(*testing.T, *Backend, string, string) func(t *testing.T) {
			return func(*testing.T) {}
		}, false},
		{"an unknown file is kept and reported", func(t *testing.T, _ *Backend, dir, mnt string) func(t *testing.T) {
			mustNoErr(t, os.MkdirAll(mnt, 0o700))
			mustNoErr(t, os.WriteFile(filepath.Join(dir, "notes"), []byte("not ours"), 0o600))
			return func(t *testing.T) {
				if _, err := os.Stat(filepath.Join(dir, "notes")); err != nil {
					t.Errorf("an unknown file was removed: %v", err)
				}
			}
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &Backend{stateDir: t.TempDir(), instance: "0123456789abcdef"}
			dir := b.quotaDir(name)
			mnt := filepath.Join(dir, quotaMount)
			mustNoErr(t, os.MkdirAll(filepath.Dir(dir), 0o700))
			check := tc.setup(t, b, dir, mnt)
			unmountAtCleanup(t, mnt) // whatever the outcome, no mount outlives the test
			err := b.removeQuota(name)
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Errorf("removeQuota: %v, want an error: %v", err, tc.wantErr)
			}
			if !tc.wantErr {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("session directory left: %v", err)
				}
			}
			if mountedBelow(t, dir) {
				t.Errorf("a mount is left below %s", dir)
			}
			check(t)
		})
	}
}

func mustNoErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// unmountAtCleanup detaches every mount at dir before the test's
// directories are removed, so a failed test leaves no mount behind (and
// TempDir's cleanup does not walk into one).
func unmountAtCleanup(t *testing.T, dir string) {
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
}

// mountedBelow reports whether /proc/self/mountinfo lists a mount at or
// below dir.
func mountedBelow(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	mustNoErr(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			return true
		}
	}
	return false
}

// LoopDevicesOf lists the loop devices whose backing file is path (for
// the integration tests too).
func LoopDevicesOf(path string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), path) {
			out = append(out, f)
		}
	}
	return out
}
