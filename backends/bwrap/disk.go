package bwrap

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/loopdisk"
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
		err = loopdisk.CopySparse(tmpl, img)
	default:
		err = b.formatDisk(img, mb)
	}
	d := &pooledDisk{img: img}
	if err == nil {
		d.mnt, err = loopdisk.Attach(img, false)
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
	// mkfs copies the directories (owners and modes included) from a
	// skeleton.
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
	return loopdisk.Format(context.Background(), b.mkfs, img, mb, skel)
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

// placeDisk attaches a detached disk mount at <stage>/fs.
func placeDisk(mnt *os.File, stage string) error {
	return loopdisk.Place(mnt, filepath.Join(stage, fsDir))
}

// mountDisk makes sure the session's disk is mounted (after a restart or a
// reboot it may not be) and returns an O_PATH descriptor of its root.
func (b *Backend) mountDisk(dir string, sf *sessionFiles) (*os.File, error) {
	mnt := filepath.Join(dir, fsDir)
	if b.diskQuota {
		mnt = filepath.Join(sf.stage, fsDir)
		if !loopdisk.Mounted(mnt) {
			m, err := loopdisk.Attach(filepath.Join(dir, diskImage), true)
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
