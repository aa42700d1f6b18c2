package loopdisk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Attach mounts the ext4 image img (nosuid, nodev, discard) through a
// loop device and returns the mount detached, as a descriptor of its root:
// it appears nowhere until Place attaches it, and it is gone with its last
// descriptor if it never is. The loop device is set to clear itself, so it
// goes with the filesystem's last mount. Done with syscalls rather than
// mount(8): that process alone cost several milliseconds, and it opens
// every bound loop device.
//
// reuse: the image may still be mounted (by an earlier boxrt process, or
// a container's mount namespace); like mount(8), its loop device is then
// used again, which makes this a second mount of the same filesystem
// rather than a second filesystem on the same image.
func Attach(img string, reuse bool) (*os.File, error) {
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	loop := -1
	if reuse {
		loop = boundLoopDevice(f)
	}
	if loop < 0 {
		if loop, err = loopDevice(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("loop device for %s: %w", img, err)
		}
	}
	defer unix.Close(loop)
	fsfd, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("mount %s: fsopen: %w", img, err)
	}
	defer unix.Close(fsfd)
	// /proc/self/fd names the very device opened above, whatever
	// /dev/loopN meanwhile is.
	if err := unix.FsconfigSetString(fsfd, "source", "/proc/self/fd/"+strconv.Itoa(loop)); err != nil {
		return nil, fmt.Errorf("mount %s: source: %w", img, err)
	}
	// discard: deleting files punches holes into the sparse image, so the
	// host gets the space back rather than keeping the high-water mark.
	for _, flag := range []string{"discard", "noinit_itable"} {
		if err := unix.FsconfigSetFlag(fsfd, flag); err != nil {
			return nil, fmt.Errorf("mount %s: %s: %w", img, flag, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("mount %s: %w", img, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("mount %s: fsmount: %w", img, err)
	}
	return os.NewFile(uintptr(mfd), img), nil
}

// Place attaches the detached mount mnt (from Attach) at target, a
// directory made (mode 0700) when missing.
func Place(mnt *os.File, target string) error {
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := unix.MoveMount(int(mnt.Fd()), "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the disk at %s: %w", target, err)
	}
	return nil
}

// Mounted reports whether the directory mnt is the root of another
// filesystem than its parent's.
func Mounted(mnt string) bool {
	var parent, st unix.Stat_t
	if unix.Lstat(filepath.Dir(mnt), &parent) != nil || unix.Lstat(mnt, &st) != nil {
		return false
	}
	return parent.Dev != st.Dev
}
