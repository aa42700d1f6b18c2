package loopdisk

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A disk's whole life: a template formatted once, a sparse copy of it,
// attached detached (invisible until placed), placed at a directory,
// written to, unmounted — which frees its loop device — and the template
// gone with Close.
func TestDiskLifecycle(t *testing.T) {
	requireLoop(t)
	mkfs, err := Mkfs()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var tmpl Template
	formats := 0
	format := func(p string) error {
		formats++
		return Format(context.Background(), mkfs, p, 64, "")
	}
	tp, err := tmpl.Get(filepath.Join(dir, "tmpl", "64.img"), format)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := tmpl.Get(filepath.Join(dir, "tmpl", "64.img"), format); err != nil || again != tp || formats != 1 {
		t.Fatalf("second Get: %q, %v after %d formats; want %q after one", again, err, formats, tp)
	}
	img := filepath.Join(dir, "disk.img")
	if err := CopySparse(tp, img); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 64<<20 || st.Blocks*512 > 8<<20 {
		t.Errorf("copy: size %d, %d bytes on disk; want 64 MiB, sparse", st.Size, st.Blocks*512)
	}

	mnt, err := Attach(img, false)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "ws")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if Mounted(target) {
		t.Fatal("a detached mount is visible before Place")
	}
	err = Place(mnt, target)
	mnt.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	if !Mounted(target) {
		t.Fatal("not mounted after Place")
	}
	if loops := boundTo(img); len(loops) != 1 {
		t.Errorf("loop devices bound to the image: %v, want one", loops)
	}
	if info := mountOptions(t, target); !strings.Contains(info, "nosuid") || !strings.Contains(info, "nodev") || !strings.Contains(info, "discard") {
		t.Errorf("mount options %q, want nosuid, nodev and discard", info)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if loops := freed(img); len(loops) != 0 {
		t.Errorf("loop devices left after the unmount: %v", loops)
	}

	// Reattached with reuse (nothing bound any more): the data is there.
	mnt, err = Attach(img, true)
	if err != nil {
		t.Fatal(err)
	}
	err = Place(mnt, target)
	mnt.Close()
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "x" {
		t.Errorf("file after a remount: %q, %v", b, err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}

	tmpl.Close()
	if _, err := os.Stat(tp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("template after Close: %v", err)
	}
	if p, err := tmpl.Get(tp, format); p != "" || err != nil || formats != 1 {
		t.Errorf("Get after Close: %q, %v (%d formats); want nothing made", p, err, formats)
	}
}

// A detached mount never placed goes with its descriptor, and its loop
// device with it.
func TestDetachedDiskGoesWithItsDescriptor(t *testing.T) {
	requireLoop(t)
	mkfs, err := Mkfs()
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := Format(context.Background(), mkfs, img, 16, ""); err != nil {
		t.Fatal(err)
	}
	mnt, err := Attach(img, false)
	if err != nil {
		t.Fatal(err)
	}
	if loops := boundTo(img); len(loops) != 1 {
		t.Errorf("loop devices bound to the image: %v, want one", loops)
	}
	mnt.Close()
	if loops := boundTo(img); len(loops) != 0 {
		t.Errorf("loop devices left after the last descriptor: %v", loops)
	}
}

// boundTo lists the loop devices whose backing file is img.
func boundTo(img string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == img {
			out = append(out, f)
		}
	}
	return out
}

// freed waits a little for the kernel to free img's loop devices (it may
// do so a moment after the unmount) and returns those still bound.
func freed(img string) []string {
	loops := boundTo(img)
	for deadline := time.Now().Add(5 * time.Second); len(loops) > 0 && time.Now().Before(deadline); loops = boundTo(img) {
		time.Sleep(5 * time.Millisecond)
	}
	return loops
}

// mountOptions is the mountinfo line of the mount at target.
func mountOptions(t *testing.T, target string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == target {
			return line
		}
	}
	t.Fatalf("no mount at %s", target)
	return ""
}
