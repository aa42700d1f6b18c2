package fdsafe

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// leak returns a pipe whose read end has close-on-exec cleared, as a
// descriptor inherited from a careless parent has.
func leak(t *testing.T) int {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	fd := int(r.Fd())
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	if cloexec(t, fd) {
		t.Fatalf("descriptor %d still close-on-exec after clearing it", fd)
	}
	return fd
}

func cloexec(t *testing.T, fd int) bool {
	t.Helper()
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatalf("F_GETFD %d: %v", fd, err)
	}
	return flags&unix.FD_CLOEXEC != 0
}

func TestSeal(t *testing.T) {
	for name, seal := range map[string]func() error{"close_range": Seal, "/proc walk": sealListed} {
		t.Run(name, func(t *testing.T) {
			fd := leak(t)
			if err := seal(); err != nil {
				t.Fatal(err)
			}
			if !cloexec(t, fd) {
				t.Errorf("descriptor %d is not close-on-exec after %s", fd, name)
			}
			for _, std := range []int{0, 1, 2} {
				if flags, err := unix.FcntlInt(uintptr(std), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC != 0 {
					t.Errorf("descriptor %d became close-on-exec", std)
				}
			}
		})
	}
}
