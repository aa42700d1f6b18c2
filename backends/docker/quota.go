package docker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
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
// for /tmp, {tmp.ext4,tmp/}. mount -o loop sets the loop device's
// autoclear flag, so unmounting the filesystem also frees the loop device.

// MinWorkspaceQuotaMB is the smallest quota an ext4 workspace can have.
const MinWorkspaceQuotaMB = 16

const (
	quotaImage = "disk.ext4"
	quotaMount = "ws"
	tmpImage   = "tmp.ext4"
	tmpMount   = "tmp"
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

// quotaTmp is quotaWorkspace for /tmp: tmp_size_mb (at least the smallest
// disk), root's and mode 1777 like any /tmp.
func (b *Backend) quotaTmp(ctx context.Context, name string) (mount.Mount, error) {
	return b.makeDisk(ctx, name, tmpImage, tmpMount, max(b.tmpSizeMB, MinWorkspaceQuotaMB), "/tmp", owner{}, os.ModeSticky|0o777)
}

// makeDisk creates and mounts one disk of the session (image, mount point
// in its quota directory) and returns the bind of it at target. Its root is
// o's, or root's with mode open when o is unknown. An error removes all
// the session's disks: it is a session being created.
func (b *Backend) makeDisk(ctx context.Context, name, image, mountDir string, sizeMB int, target string, o owner, open os.FileMode) (_ mount.Mount, err error) {
	dir := b.quotaDir(name)
	defer func() {
		if err != nil {
			b.removeQuota(name)
		}
	}()
	mnt := filepath.Join(dir, mountDir)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return mount.Mount{}, boxerr.Failure("docker backend: creating %s: %v", mnt, err).Wrap(err)
	}
	img := filepath.Join(dir, image)
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return mount.Mount{}, boxerr.Failure("docker backend: creating %s: %v", img, err).Wrap(err)
	}
	err = f.Truncate(int64(sizeMB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return mount.Mount{}, boxerr.Failure("docker backend: sizing %s: %v", img, err).Wrap(err)
	}
	// No blocks reserved for root; a 4 MiB journal instead of up to
	// 1 GiB (a 1 GiB filesystem would otherwise take 33 MB of host disk
	// before anything is written).
	args := []string{"-q", "-F", "-m", "0", "-J", "size=4"}
	if o.known {
		gid := o.gid
		if gid < 0 {
			gid = o.uid
		}
		args = append(args, "-E", fmt.Sprintf("root_owner=%d:%d", o.uid, gid))
	}
	if err := run(ctx, "mkfs.ext4", append(args, img)...); err != nil {
		return mount.Mount{}, err
	}
	if err := mountDisk(ctx, img, mnt); err != nil {
		return mount.Mount{}, err
	}
	if !o.known {
		if err := os.Chmod(mnt, open); err != nil {
			return mount.Mount{}, boxerr.Failure("docker backend: opening %s to the sandbox user: %v", mnt, err).Wrap(err)
		}
	}
	// Empty, as a fresh volume would be.
	_ = os.Remove(filepath.Join(mnt, "lost+found"))
	return mount.Mount{Type: mount.TypeBind, Source: mnt, Target: target}, nil
}

// mountQuota loop-mounts the session's disks that are not mounted already
// (after a host reboot they are not, and a persistent container is
// restarted on them).
func (b *Backend) mountQuota(ctx context.Context, name string) error {
	dir := b.quotaDir(name)
	for _, d := range disks {
		img := filepath.Join(dir, d[0])
		if _, err := os.Stat(img); err != nil {
			continue
		}
		if err := mountDisk(ctx, img, filepath.Join(dir, d[1])); err != nil {
			return err
		}
	}
	return nil
}

// mountDisk loop-mounts img on mnt unless something is mounted there.
func mountDisk(ctx context.Context, img, mnt string) error {
	if mounted(mnt) {
		return nil
	}
	// discard: deleting files punches holes in the sparse image, so the
	// host gets the space back rather than keeping the high-water mark.
	return run(ctx, "mount", "-t", "ext4", "-o", "loop,nosuid,nodev,discard", img, mnt)
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
// container is gone, except those of a session being created right now.
func (b *Backend) collectQuotas(keep map[string]bool) {
	if b.stateDir == "" {
		return
	}
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

// mounted reports whether dir is a mount point: its device differs from
// its parent's.
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return boxerr.Failure("docker backend: %s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out))).Wrap(err)
	}
	return nil
}
