package fdsafe

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// firstUnsafe is the lowest descriptor Seal marks: stdin, stdout and
// stderr are the protocol and the log, and every child is given its own.
const firstUnsafe = 3

// Seal marks close-on-exec every descriptor above stderr. boxrt opens
// all of its own descriptors close-on-exec (Go does), and hands a child
// only what it names in exec.Cmd (ExtraFiles are dup'ed without the flag),
// so after Seal nothing inherited survives an exec. The descriptors stay
// open: the parent may expect them held, and closing one under a library
// that had already taken it would be worse than keeping it.
func Seal() error {
	// close_range(2) does it in one call and needs no /proc; kernels
	// before 5.11 do not have CLOSE_RANGE_CLOEXEC.
	err := unix.CloseRange(firstUnsafe, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("close_range: %w", err)
	}
	return sealListed()
}

// sealListed is Seal by walking /proc/self/fd.
func sealListed() error {
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("cannot list inherited descriptors (is /proc mounted?): %w", err)
	}
	names, err := dir.Readdirnames(-1)
	// The listing's own descriptor is in names; it is closed (and
	// close-on-exec anyway) by the time the loop reaches it.
	dir.Close()
	if err != nil {
		return fmt.Errorf("cannot list inherited descriptors: %w", err)
	}
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || fd < firstUnsafe {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if errors.Is(err, unix.EBADF) {
			continue
		}
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		}
		if err != nil {
			return fmt.Errorf("cannot mark descriptor %d close-on-exec: %w", fd, err)
		}
	}
	return nil
}
