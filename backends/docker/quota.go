package docker

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/loopdisk"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// A workspace with a quota is an ext4 filesystem in a sparse file, loop
// mounted on the host and bound into the container. The local volume
// driver cannot do it (Docker 20.10 hands "loop" to mount(2) as fs data,
// which ext4 refuses), and overlay2 has no per-container size limit without
// xfs project quotas. A full filesystem is ENOSPC to the command; the host
// disk only ever holds what was written, up to the quota.
//
// A session's /tmp is such a disk too, of tmp_size_mb (see tmpMount).
//
// Layout: <state dir>/docker/<instance id>/<container>/{disk.ext4,ws/} and,
// for /tmp, {tmp.ext4,tmp/}. The disks are made and mounted by
// backends/internal/loopdisk, without mount(8) or losetup (which open every
// bound loop device: their cost grew with the number of sessions); the
// mount at ws/ and tmp/ is a real one, since the engine binds that path
// into the container. The loop device clears itself, so unmounting the
// filesystem (its last mount) also frees the loop device.
//
// Disks of the configured sizes (the default quota's, /tmp's) are sparse
// copies of a template formatted once per Backend, in
// <instance dir>/.templates/<Backend token>/; Close removes it, Adopt those
// of earlier boxrt processes. A spec's own quota is formatted for its
// session: a template per size asked for would let callers fill the host
// with them.

// MinWorkspaceQuotaMB is the smallest quota an ext4 workspace can have.
const MinWorkspaceQuotaMB = 16

const (
	quotaImage = "disk.ext4"
	quotaMount = "ws"
	tmpImage   = "tmp.ext4"
	tmpMount   = "tmp"
	// templatesDir is below the instance directory (collectQuotas never
	// takes it for a container's: they start with containerPrefix).
	templatesDir = ".templates"
)

// disks are a session's possible disks: image file and mount point.
var disks = [][2]string{{quotaImage, quotaMount}, {tmpImage, tmpMount}}

// quotaDir is where the session's disk image and mount point live.
func (b *Backend) quotaDir(container string) string {
	return filepath.Join(b.stateDir, "docker", b.instance, container)
}

// effectiveQuota is the quota the workspace of spec gets: its own, else the
// configured default; 0 means none. Host-path workspaces are the host's
// directories and never get one.
func (b *Backend) effectiveQuota(spec backends.SandboxSpec) int {
	if spec.HostPath != "" && spec.HostPathMode != backends.MountNone {
		return 0
	}
	if spec.WorkspaceQuotaMB > 0 {
		return spec.WorkspaceQuotaMB
	}
	if !b.localEngine() {
		return 0
	}
	return b.defaultQuotaMB
}

// localEngine reports whether the engine shares this host's filesystem,
// which a loop-mounted workspace needs.
func (b *Backend) localEngine() bool {
	return strings.HasPrefix(b.cli.DaemonHost(), "unix://")
}

// quotaWorkspace creates and mounts the session's quota filesystem and
// returns the bind of it. The root directory is given to the sandbox user
// (or made world-writable when that user is unknown), as a volume would
// inherit the image's ownership of the mount path.
func (b *Backend) quotaWorkspace(ctx context.Context, name string, sizeMB int, target string, o owner) (mount.Mount, error) {
	if b.stateDir == "" || !b.localEngine() {
		return mount.Mount{}, boxerr.Validation("workspace_quota_mb", "workspace_quota_mb needs a Docker engine on this host (and a state directory); this one is at %s", b.cli.DaemonHost())
	}
	if sizeMB < MinWorkspaceQuotaMB {
		return mount.Mount{}, boxerr.Validation("workspace_quota_mb", "workspace_quota_mb must be 0 or at least %d on docker, got %d", MinWorkspaceQuotaMB, sizeMB)
	}
	return b.makeDisk(ctx, name, quotaImage, quotaMount, sizeMB, target, o, 0o777)
}

// quotaTmp is quotaWorkspace for /tmp: root's and mode 1777 like any /tmp.
func (b *Backend) quotaTmp(ctx context.Context, name string) (mount.Mount, error) {
	return b.makeDisk(ctx, name, tmpImage, tmpMount, b.tmpDiskMB(), "/tmp", owner{}, unix.S_ISVTX|0o777)
}

// tmpDiskMB is the size of a session's /tmp disk: tmp_size_mb, at least
// the smallest disk.
func (b *Backend) tmpDiskMB() int { return max(b.tmpSizeMB, MinWorkspaceQuotaMB) }

// makeDisk creates and mounts one disk of the session (image, mount point
// in its quota directory) and returns the bind of it at target. Its root is
// o's, or root's with mode open when o is unknown. An error removes all
// the session's disks: it is a session being created.
func (b *Backend) makeDisk(ctx context.Context, name, image, mountDir string, sizeMB int, target string, o owner, open uint32) (_ mount.Mount, err error) {
	dir := b.quotaDir(name)
	defer func() {
		if err != nil {
			b.removeQuota(name)
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return mount.Mount{}, boxerr.Failure("docker backend: creating %s: %v", dir, err).Wrap(err)
	}
	img := filepath.Join(dir, image)
	if err := b.disks.image(ctx, img, sizeMB); err != nil {
		return mount.Mount{}, diskError("making the disk image "+img, err)
	}
	m, err := loopdisk.Attach(img, false)
	if err != nil {
		return mount.Mount{}, diskError("mounting "+img, err)
	}
	defer m.Close()
	if err := prepareRoot(m, o, open); err != nil {
		return mount.Mount{}, boxerr.Failure("docker backend: preparing the root of %s: %v", img, err).Wrap(err)
	}
	mnt := filepath.Join(dir, mountDir)
	if err := loopdisk.Place(m, mnt); err != nil {
		return mount.Mount{}, diskError("mounting "+img, err)
	}
	return mount.Mount{Type: mount.TypeBind, Source: mnt, Target: target}, nil
}

// prepareRoot makes the root of a new disk's detached mount o's, or
// root's with mode open when o is unknown, as a volume would inherit the
// image's ownership of the mount path; and empty, as a fresh volume is.
// The engine sees the disk only once it is so.
func prepareRoot(m *os.File, o owner, open uint32) error {
	fd, err := unix.Openat(int(m.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if o.known {
		gid := o.gid
		if gid < 0 {
			gid = o.uid
		}
		err = unix.Fchown(fd, o.uid, gid)
	} else {
		err = unix.Fchmod(fd, open)
	}
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(fd, "lost+found", unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// diskError is a disk that could not be made or mounted; a host without
// mkfs.ext4 or loop devices is told what to install.
func diskError(what string, err error) error {
	if errors.Is(err, loopdisk.ErrNoMkfs) || errors.Is(err, loopdisk.ErrNoLoopDevices) {
		return boxerr.BackendUnavailable("docker backend: %s: %v; workspace_quota_mb and the /tmp disk need mkfs.ext4 (e2fsprogs) and loop devices on the engine's host, "+
			"or set docker.workspace_quota_mb to 0 and request no quota", what, err).Wrap(err)
	}
	return boxerr.Failure("docker backend: %s: %v", what, err).Wrap(err)
}

// mountQuota mounts the session's disks that are not mounted already
// (after a host reboot they are not, and a persistent container is
// restarted on them).
func (b *Backend) mountQuota(name string) error {
	dir := b.quotaDir(name)
	for _, d := range disks {
		img := filepath.Join(dir, d[0])
		mnt := filepath.Join(dir, d[1])
		if _, err := os.Stat(img); err != nil || loopdisk.Mounted(mnt) {
			continue
		}
		// reuse: a container's mount namespace may hold the filesystem
		// still; this mounts it again rather than a second one on it.
		m, err := loopdisk.Attach(img, true)
		if err != nil {
			return diskError("mounting "+img, err)
		}
		err = loopdisk.Place(m, mnt)
		m.Close()
		if err != nil {
			return diskError("mounting "+img, err)
		}
	}
	return nil
}

// hasQuota reports whether the session has a disk (its workspace, its /tmp).
func (b *Backend) hasQuota(name string) bool {
	if b.stateDir == "" {
		return false
	}
	for _, d := range disks {
		if _, err := os.Stat(filepath.Join(b.quotaDir(name), d[0])); err == nil {
			return true
		}
	}
	return false
}

// removeQuota unmounts (freeing the loop devices) and deletes the session's
// disks. Missing pieces are not an error.
//
// It unmounts whether or not the workspace looks mounted, and then removes
// only the known pieces, each with os.Remove: a tree walk (RemoveAll) that
// a wrong "not mounted" let into a live workspace would delete the
// session's files, while removing a mount point still in use fails with
// EBUSY and leaves everything in place.
func (b *Backend) removeQuota(name string) error {
	if b.stateDir == "" {
		return nil
	}
	dir := b.quotaDir(name)
	var paths []string
	for _, d := range disks {
		mnt := filepath.Join(dir, d[1])
		if err := unmount(mnt); err != nil {
			return boxerr.Failure("docker backend: unmounting %s: %v", mnt, err).Wrap(err)
		}
		// The mount point before the image: if it is somehow still a
		// mount, its filesystem's image must stay.
		paths = append(paths, mnt, filepath.Join(dir, d[0]))
	}
	for _, p := range append(paths, dir) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return boxerr.Failure("docker backend: removing %s: %v", p, err).Wrap(err)
		}
	}
	return nil
}

// unmount unmounts what is mounted at dir; nothing mounted there (EINVAL)
// or no dir (ENOENT) is success.
func unmount(dir string) error {
	err := unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		// An engine that has not let go yet: detach it now, the kernel
		// frees the loop device with the last user.
		err = unix.Unmount(dir, unix.MNT_DETACH)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// collectQuotas removes the quota filesystems of this instance whose
// container is gone, except those of a session being created right now,
// and the disk templates of earlier boxrt processes.
func (b *Backend) collectQuotas(keep map[string]bool) {
	if b.stateDir == "" {
		return
	}
	b.collectTemplates()
	entries, err := os.ReadDir(filepath.Join(b.stateDir, "docker", b.instance))
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || keep[e.Name()] || b.creating.Has(e.Name()) || !strings.HasPrefix(e.Name(), containerPrefix) {
			continue
		}
		_ = b.removeQuota(e.Name())
	}
}
