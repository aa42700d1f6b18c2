package bwrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

// A session's own writable storage — workspace/, tmp/ and home/ — lives on
// a filesystem of its own: when boxrt is root, a sparse ext4 image
// (<session dir>/disk.img, workspace_quota_mb in size, DefaultQuotaMB when
// 0) loop-mounted once per session at <stage>/fs (see stage.go). A full
// disk is ENOSPC to the command that fills it, never a full host disk, and
// deleting files gives the space back to the host (discard punches holes
// into the image). Without root there is no loop mount: <session dir>/fs
// is a plain directory and the quota is not enforced (Describe says so).
const (
	// DefaultQuotaMB bounds a session's workspace, /tmp and /home together
	// when workspace_quota_mb is 0 (the reference default, "unlimited").
	DefaultQuotaMB = 1024
	// minQuotaMB is the smallest image made: ext4 with its journal needs a
	// few MiB of its own.
	minQuotaMB = 16

	diskImage = "disk.img"
	fsDir     = "fs"
)

// quotaMB is the size of a session's disk.
func quotaMB(info backends.Session) int {
	q := info.WorkspaceQuotaMB
	if q == 0 {
		q = DefaultQuotaMB
	}
	return max(q, minQuotaMB)
}

// makeDisk creates the session's storage and leaves it mounted in the
// session's stage: a disk from the pool when the session has the default
// size (see diskPool), else one formatted now.
func (b *Backend) makeDisk(dir string, sf *sessionFiles, info backends.Session) error {
	if !b.diskQuota {
		plain := filepath.Join(dir, fsDir)
		if err := os.Mkdir(plain, 0o700); err != nil {
			return err
		}
		root, err := os.OpenFile(plain, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer root.Close()
		return b.initDisk(root)
	}
	img := filepath.Join(dir, diskImage)
	var d *pooledDisk
	if quotaMB(info) == DefaultQuotaMB {
		if d = b.pool.take(b); d != nil {
			if err := os.Rename(d.img, img); err != nil {
				d.release()
				d = nil
			}
		}
	}
	if d == nil {
		var err error
		if d, err = b.newDisk(img, quotaMB(info)); err != nil {
			return err
		}
	}
	defer d.mnt.Close()
	return placeDisk(d.mnt, sf.stage)
}

// newDisk makes a disk image of mb MiB at img, its directories included,
// and mounts it as a detached mount. A default-size image is a copy of the
// Backend's template (diskTemplate), which is much cheaper than mkfs.ext4;
// other sizes, and every size once the Backend is closed, are formatted.
func (b *Backend) newDisk(img string, mb int) (*pooledDisk, error) {
	var tmpl string
	var err error
	if mb == DefaultQuotaMB {
		tmpl, err = b.diskTemplate()
	}
	switch {
	case err != nil:
	case tmpl != "":
		err = copySparse(tmpl, img)
	default:
		err = b.formatDisk(img, mb)
	}
	d := &pooledDisk{img: img}
	if err == nil {
		d.mnt, err = attachDisk(img, false)
	}
	if err != nil {
		d.release()
		return nil, err
	}
	return d, nil
}

// formatDisk makes a sparse image of mb MiB at img holding an ext4 with
// workspace/, tmp/ and home/ in it, owned by the sandbox user.
func (b *Backend) formatDisk(img string, mb int) error {
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(mb) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// mkfs copies the directories (owners and modes included) from a
	// skeleton: the image is complete without ever being mounted here.
	skel, err := os.MkdirTemp(filepath.Dir(img), ".skel-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(skel)
	root, err := os.OpenFile(skel, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	err = b.initDisk(root)
	root.Close()
	if err != nil {
		return err
	}
	// Lazy inode-table and journal init keep the image sparse; the small
	// journal keeps the fs overhead of a small quota small.
	if out, err := exec.Command(b.mkfs, "-q", "-F", "-m", "0", "-J", "size=4",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0", "-d", skel, img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// copySparse copies the image src to a new file dst, leaving src's holes
// holes (a fresh ext4 image is almost all hole).
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = copyData(int(in.Fd()), int(out.Fd()), fi.Size())
	if err == nil {
		err = out.Truncate(fi.Size())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
	}
	return err
}

// copyData copies the data extents of in to the same offsets of out.
func copyData(in, out int, size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for r, w := data, data; r < hole; {
			n, err := unix.CopyFileRange(in, &r, out, &w, int(hole-r), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("copy: unexpected end of file at %d", r)
			}
		}
		off = hole
	}
	return nil
}

// initDisk makes workspace/, tmp/ and home/ in a fresh disk's root,
// owned by the sandbox user.
func (b *Backend) initDisk(root *os.File) error {
	rootfd := int(root.Fd())
	for _, d := range []struct {
		name string
		mode uint32
	}{{workspaceDir, 0o755}, {tmpDir, 0o1777}, {homeDir, 0o755}} {
		if err := unix.Mkdirat(rootfd, d.name, d.mode); err != nil {
			return err
		}
		if err := b.id.chown(rootfd, d.name); err != nil {
			return err
		}
		// Mkdirat applies the umask; tmp must be sticky and world-writable.
		if err := unix.Fchmodat(rootfd, d.name, d.mode, 0); err != nil {
			return err
		}
	}
	return nil
}

// attachDisk mounts the ext4 image img (nosuid, nodev, discard) through a
// loop device and returns the mount detached, as a descriptor: it appears
// nowhere until placeDisk attaches it, and it is gone with its last
// descriptor if it never is. The loop device is set to clear itself, so it
// goes with the filesystem's last mount. Done with syscalls rather than
// mount(8): that process alone cost several milliseconds.
//
// reuse: the image may still be mounted (a stage of an earlier boxrt
// process being detached, say); like mount(8), its loop device is then
// used again, which makes this a second mount of the same filesystem
// rather than a second filesystem on the same image.
func attachDisk(img string, reuse bool) (*os.File, error) {
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

// loopMu serialises boxrt's own loop-device binds. Every bind takes the
// lowest free device, so concurrent ones (sessions created together, the
// disk pool refilling, released devices coming free) collided, and now and
// then one lost eight times running: 3–8 failed creates in 2,000 of the
// scale benchmark, 13–36 failed binds in 1,200 of
// TestLoopDeviceBindsUnderChurn.
var loopMu sync.Mutex

// loopAttempts bounds the binds tried when other processes (losetup, a
// second boxrt) keep taking the free device first.
const loopAttempts = 32

// loopDevice binds a free loop device to the open image file, with
// autoclear, and returns the device's descriptor.
func loopDevice(file int) (int, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(ctl)
	loopMu.Lock()
	defer loopMu.Unlock()
	var tried []string
	for range loopAttempts {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return -1, err
		}
		dev := "loop" + strconv.Itoa(n)
		if slices.Contains(tried, dev) {
			// Offered again after another process took it: let the
			// processes racing for it go first.
			time.Sleep(time.Millisecond)
		}
		tried = append(tried, dev)
		fd, err := unix.Open("/dev/"+dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		cfg := unix.LoopConfig{Fd: uint32(file)}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil {
			return fd, nil
		}
		unix.Close(fd)
		if err != unix.EBUSY {
			return -1, fmt.Errorf("LOOP_CONFIGURE (Linux 5.8 or later): %w", err)
		}
	}
	return -1, fmt.Errorf("every free loop device was taken by another process first (tried %s): %w", strings.Join(tried, " "), unix.EBUSY)
}

// boundLoopDevice returns a descriptor of a loop device already bound to
// the open image f, or -1.
func boundLoopDevice(f *os.File) int {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return -1
	}
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range devs {
		// The path (which follows renames) only narrows the search; the
		// inode decides.
		if strings.TrimSpace(readString(p)) != f.Name() {
			continue
		}
		dev := filepath.Base(filepath.Dir(filepath.Dir(p)))
		fd, err := unix.Open("/dev/"+dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		if err == nil && info.Inode == st.Ino && info.Device == st.Dev {
			return fd
		}
		unix.Close(fd)
	}
	return -1
}

// placeDisk attaches a detached disk mount at <stage>/fs.
func placeDisk(mnt *os.File, stage string) error {
	target := filepath.Join(stage, fsDir)
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := unix.MoveMount(int(mnt.Fd()), "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the disk at %s: %w", target, err)
	}
	return nil
}

// mountDisk makes sure the session's disk is mounted (after a restart or a
// reboot it may not be) and returns an O_PATH descriptor of its root.
func (b *Backend) mountDisk(dir string, sf *sessionFiles) (*os.File, error) {
	mnt := filepath.Join(dir, fsDir)
	if b.diskQuota {
		mnt = filepath.Join(sf.stage, fsDir)
		if !isMountPoint(sf.stage, mnt) {
			m, err := attachDisk(filepath.Join(dir, diskImage), true)
			if err != nil {
				return nil, fmt.Errorf("mount the disk of session %s: %w", dir, err)
			}
			err = placeDisk(m, sf.stage)
			m.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	fd, _, err := openBeneath(unix.AT_FDCWD, mnt, false, false, b.id)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", mnt, err)
	}
	// Only root and the sandbox user pass through the disk's root.
	if b.diskQuota {
		if err := b.restrict(fd, ""); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	return os.NewFile(uintptr(fd), mnt), nil
}

// isMountPoint reports whether mnt (a directory in dir) is the root of
// another filesystem.
func isMountPoint(dir, mnt string) bool {
	var a, c unix.Stat_t
	if unix.Lstat(dir, &a) != nil || unix.Lstat(mnt, &c) != nil {
		return false
	}
	return a.Dev != c.Dev
}

// diskTools finds mkfs.ext4 when the loop-mounted disk can be used (root
// only). The reason why not goes into Describe's notes.
func diskTools() (mkfs string, why string) {
	if os.Geteuid() != 0 {
		return "", "boxrt is not root"
	}
	mkfs, err := lookSbin("mkfs.ext4")
	if err != nil {
		return "", "mkfs.ext4 is missing (apt-get install e2fsprogs)"
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "", "the kernel has no loop devices (/dev/loop-control)"
	}
	return mkfs, ""
}

// lookSbin finds a system tool also when PATH lacks the sbin directories
// (services often run with a minimal PATH).
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &exec.Error{Name: name, Err: exec.ErrNotFound}
}
