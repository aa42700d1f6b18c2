package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends/internal/loopdisk"
	"github.com/boxrt/boxrt/internal/boxerr"
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
				if loops := waitLoopsFreed(img); len(loops) > 0 {
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

// TestMakeDisk: a session's disks are mounted at its quota directory
// (where the engine binds them from) with the root the container's user
// would find in a fresh volume — the image's user's, else open to all —
// and empty; disks of a configured size are copies of one template, other
// sizes formatted; removing the session frees the loop devices, and Close
// removes the template.
func TestMakeDisk(t *testing.T) {
	const name = "boxrt-disk-test-0123abcd"
	b := &Backend{stateDir: t.TempDir(), instance: "0123456789abcdef"}
	b.disks = newDiskImages(b.templateDir(), 32)
	ctx := context.Background()
	tests := []struct {
		image, mountDir string
		sizeMB          int
		o               owner
		open            uint32
		wantUID         int
		wantGID         int
		wantMode        os.FileMode
	}{
		{quotaImage, quotaMount, 32, owner{uid: 1234, gid: -1, known: true}, 0o777, 1234, 1234, os.ModeDir | 0o755},
		{tmpImage, tmpMount, 16, owner{}, unix.S_ISVTX | 0o777, 0, 0, os.ModeDir | os.ModeSticky | 0o777},
	}
	var images []string
	for _, tc := range tests {
		m, err := b.makeDisk(ctx, name, tc.image, tc.mountDir, tc.sizeMB, "/target", tc.o, tc.open)
		if err != nil {
			t.Fatal(err)
		}
		mnt := filepath.Join(b.quotaDir(name), tc.mountDir)
		unmountAtCleanup(t, mnt)
		images = append(images, filepath.Join(b.quotaDir(name), tc.image))
		if m.Source != mnt || m.Target != "/target" {
			t.Errorf("bind %s → %s, want %s → /target", m.Source, m.Target, mnt)
		}
		if !mountedBelow(t, mnt) {
			t.Fatalf("%s is not a mount in this namespace", mnt)
		}
		fi, err := os.Stat(mnt)
		mustNoErr(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != tc.wantUID || int(st.Gid) != tc.wantGID || fi.Mode() != tc.wantMode {
			t.Errorf("%s: root %d:%d %v, want %d:%d %v", tc.mountDir, st.Uid, st.Gid, fi.Mode(), tc.wantUID, tc.wantGID, tc.wantMode)
		}
		if entries, err := os.ReadDir(mnt); err != nil || len(entries) > 0 {
			t.Errorf("%s: a new disk holds %v (%v)", tc.mountDir, entries, err)
		}
		var fs unix.Statfs_t
		mustNoErr(t, unix.Statfs(mnt, &fs))
		if size := int64(fs.Blocks) * fs.Bsize; size > int64(tc.sizeMB)<<20 || size < int64(tc.sizeMB-8)<<20 {
			t.Errorf("%s: a filesystem of %d bytes, want about %d MiB", tc.mountDir, size, tc.sizeMB)
		}
	}
	if tmpls, _ := filepath.Glob(filepath.Join(b.disks.dir, "*")); len(tmpls) != 1 || filepath.Base(tmpls[0]) != "32.img" {
		t.Errorf("templates %v, want the configured size's only", tmpls)
	}
	mustNoErr(t, b.removeQuota(name))
	for _, img := range images {
		if loops := waitLoopsFreed(img); len(loops) > 0 {
			t.Errorf("loop devices left: %v", loops)
		}
	}
	b.disks.close()
	if _, err := os.Stat(filepath.Dir(b.disks.dir)); !os.IsNotExist(err) {
		t.Errorf("templates left after close: %v", err)
	}
}

// TestMountQuotaReusesItsLoopDevice: a kept session's disk still held
// elsewhere (a container's mount namespace, here a second mount) is
// mounted again on its loop device, not as a second filesystem on the
// same image.
func TestMountQuotaReusesItsLoopDevice(t *testing.T) {
	const name = "boxrt-reuse-test-0123abcd"
	b := &Backend{stateDir: t.TempDir(), instance: "0123456789abcdef"}
	b.disks = newDiskImages(b.templateDir())
	defer b.disks.close()
	if _, err := b.makeDisk(context.Background(), name, quotaImage, quotaMount, 16, "/w", owner{}, 0o777); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(b.quotaDir(name), quotaMount)
	unmountAtCleanup(t, mnt)
	mustNoErr(t, os.WriteFile(filepath.Join(mnt, "kept"), []byte("x"), 0o600))
	holder := t.TempDir()
	mustNoErr(t, unix.Mount(mnt, holder, "", unix.MS_BIND, ""))
	unmountAtCleanup(t, holder)
	mustNoErr(t, unix.Unmount(mnt, 0))

	mustNoErr(t, b.mountQuota(name))
	img := filepath.Join(b.quotaDir(name), quotaImage)
	if loops := LoopDevicesOf(img); len(loops) != 1 {
		t.Errorf("loop devices of the image: %v, want the one it had", loops)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "kept")); err != nil || string(got) != "x" {
		t.Errorf("the remounted disk: %q, %v", got, err)
	}
	mustNoErr(t, unix.Unmount(holder, 0))
	mustNoErr(t, b.removeQuota(name))
	if loops := waitLoopsFreed(img); len(loops) > 0 {
		t.Errorf("loop devices left: %v", loops)
	}
}

// waitLoopsFreed waits a little for the kernel to free the loop devices of
// img (it may do so a moment after the last unmount) and returns those
// still bound.
func waitLoopsFreed(img string) []string {
	loops := LoopDevicesOf(img)
	for deadline := time.Now().Add(5 * time.Second); len(loops) > 0 && time.Now().Before(deadline); loops = LoopDevicesOf(img) {
		time.Sleep(5 * time.Millisecond)
	}
	return loops
}

// TestCollectTemplates: Adopt removes the disk templates an earlier boxrt
// process left, never the running Backend's own.
func TestCollectTemplates(t *testing.T) {
	b := &Backend{stateDir: t.TempDir(), instance: "0123456789abcdef"}
	b.disks = newDiskImages(b.templateDir(), 16)
	stale := filepath.Join(filepath.Dir(b.disks.dir), "deadbeefdeadbeef")
	for _, dir := range []string{stale, b.disks.dir} {
		mustNoErr(t, os.MkdirAll(dir, 0o700))
		mustNoErr(t, os.WriteFile(filepath.Join(dir, "16.img"), nil, 0o600))
	}
	b.collectQuotas(nil)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("an earlier process's templates are left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.disks.dir, "16.img")); err != nil {
		t.Errorf("the running Backend's template was removed: %v", err)
	}
}

// TestDiskErrorTypes: a host that cannot make disks is a setup problem
// the error names (BoxBackendUnavailableError), anything else a failure.
func TestDiskErrorTypes(t *testing.T) {
	for _, tc := range []struct {
		cause error
		want  *boxerr.Kind
	}{
		{fmt.Errorf("%w: exec: not found", loopdisk.ErrNoMkfs), boxerr.ErrBackendUnavailable},
		{fmt.Errorf("loop device for x: %w: ENOENT", loopdisk.ErrNoLoopDevices), boxerr.ErrBackendUnavailable},
		{unix.EIO, boxerr.ErrBox},
	} {
		err := diskError("mounting x", tc.cause)
		if !errors.Is(err, tc.want) || !errors.Is(err, tc.cause) {
			t.Errorf("%v: %v, want a %s wrapping the cause", tc.cause, err, tc.want)
		}
		if tc.want == boxerr.ErrBackendUnavailable && !strings.Contains(err.Error(), "e2fsprogs") {
			t.Errorf("%v: %q does not say what to install", tc.cause, err)
		}
	}
}
