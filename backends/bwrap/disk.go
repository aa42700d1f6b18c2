package bwrap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

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

// makeDisk creates the session's storage and leaves it mounted.
func (b *Backend) makeDisk(dir string, sf *sessionFiles, info backends.Session) error {
	if b.diskQuota {
		img := filepath.Join(dir, diskImage)
		f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(int64(quotaMB(info)) << 20)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		// Lazy inode-table and journal init keep the image sparse; the
		// small journal keeps the fs overhead of a small quota small.
		if out, err := exec.Command(b.mkfs, "-q", "-F", "-m", "0", "-J", "size=4",
			"-E", "lazy_itable_init=1,lazy_journal_init=1", img).CombinedOutput(); err != nil {
			return fmt.Errorf("mkfs.ext4 %s: %v: %s", img, err, strings.TrimSpace(string(out)))
		}
	} else if err := os.Mkdir(filepath.Join(dir, fsDir), 0o700); err != nil {
		return err
	}
	root, err := b.mountDisk(dir, sf)
	if err != nil {
		return err
	}
	defer root.Close()
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

// mountDisk makes sure the session's disk is mounted (after a restart or a
// reboot it may not be) and returns an O_PATH descriptor of its root.
func (b *Backend) mountDisk(dir string, sf *sessionFiles) (*os.File, error) {
	mnt := filepath.Join(dir, fsDir)
	if b.diskQuota {
		mnt = filepath.Join(sf.stage, fsDir)
		if !isMountPoint(sf.stage, mnt) {
			if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, err
			}
			// -o loop sets up the loop device with autoclear: it goes with
			// the unmount, so StopSession cannot leak it.
			out, err := exec.Command(b.mount, "-t", "ext4", "-o", "loop,nosuid,nodev,discard,noinit_itable",
				filepath.Join(dir, diskImage), mnt).CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("mount the disk of session %s: %v: %s", dir, err, strings.TrimSpace(string(out)))
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

// diskTools finds mkfs.ext4 and mount when the loop-mounted disk can be
// used (root only). The reason why not goes into Describe's notes.
func diskTools() (mkfs, mount string, why string) {
	if os.Geteuid() != 0 {
		return "", "", "boxrt is not root"
	}
	var err1, err2 error
	if mkfs, err1 = lookSbin("mkfs.ext4"); err1 != nil {
		return "", "", "mkfs.ext4 is missing (apt-get install e2fsprogs)"
	}
	if mount, err2 = lookSbin("mount"); err2 != nil {
		return "", "", "mount is missing (apt-get install mount)"
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "", "", "the kernel has no loop devices (/dev/loop-control)"
	}
	return mkfs, mount, ""
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
