package bwrap

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// bwrap runs as the sandbox user and (Debian's 0.8 included) resolves the
// source of --bind-fd back to a path it then walks as that user, so every
// ancestor must be searchable by it — which the state directory (0700) and
// many host paths are not, and should not have to be. So when boxrt is
// root, each session gets a stage directory,
// stageRoot/<InstanceID>/<session dir>/, that only root and the sandbox
// group may pass through, and everything the session's sandboxes bind is
// mounted there first: its disk (fs/) and a clone of every host directory
// (h<n>/), cloned from the symlink-free descriptor with open_tree and
// attached with move_mount — no path is resolved again. bwrap binds from
// the stage by descriptor and checks it got that inode.
//
// stageRoot is on /run, usually a tmpfs a reboot clears together with the
// loop mounts; an adopted session is staged again on first use either
// way. Removing a stage's mount points (rmdir) also detaches the copies
// other mount namespaces took of them, so nothing lingers there.
const stageRoot = "/run/boxrt/bwrap"

// stageFor returns the stage directory of a session ("" without root),
// cleared of what an earlier boxrt process staged there and created
// root:<sandbox group> 0710.
func (b *Backend) stageFor(key string) (string, error) {
	if b.id.cred == nil {
		return "", nil
	}
	b.stageOnce.Do(func() { b.stageErr = b.prepareStageRoot() })
	if b.stageErr != nil {
		return "", b.stageErr
	}
	dir := filepath.Join(stageRoot, b.cfg.InstanceID, key)
	if err := unstage(dir); err != nil {
		return "", err
	}
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrNotExist) {
		// The instance's directory went with a closed Backend of the same
		// instance (a backend switch): make it again.
		if err = b.prepareStageRoot(); err == nil {
			err = os.Mkdir(dir, 0o700)
		}
	}
	if err != nil {
		return "", err
	}
	if err := b.restrict(unix.AT_FDCWD, dir); err != nil {
		return "", err
	}
	return dir, nil
}

// prepareStageRoot makes stageRoot and stageRoot/<instance> directories
// only root and the sandbox group may pass through.
func (b *Backend) prepareStageRoot() error {
	inst := filepath.Join(stageRoot, b.cfg.InstanceID)
	if err := os.MkdirAll(inst, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", inst, err)
	}
	for _, d := range []string{stageRoot, inst} {
		if err := b.restrict(unix.AT_FDCWD, d); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	// /run/boxrt is shared with the rest of boxrt: only make sure the
	// sandbox user can pass.
	var st unix.Stat_t
	parent := filepath.Dir(stageRoot)
	if err := unix.Stat(parent, &st); err != nil {
		return err
	}
	if st.Mode&0o001 == 0 {
		return unix.Chmod(parent, st.Mode&0o7777|0o001)
	}
	return nil
}

// stageDir mounts a clone of the directory open as dir at a new h<n> in
// the session's stage — nosuid, nodev and, for rw, idmapped (idmap.go) —
// and returns an O_PATH descriptor of the clone.
func (sf *sessionFiles) stageDir(dir *os.File, n int, idmap *os.File) (*os.File, error) {
	tree, err := unix.OpenTree(int(dir.Fd()), "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH|unix.AT_RECURSIVE)
	if err != nil {
		return nil, fmt.Errorf("clone %s: %w", dir.Name(), err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if idmap != nil {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(idmap.Fd())
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return nil, fmt.Errorf("set the attributes of the clone of %s (a filesystem without idmapped mounts cannot be mounted rw): %w", dir.Name(), err)
	}
	target := filepath.Join(sf.stage, "h"+strconv.Itoa(n))
	if err := os.Mkdir(target, 0o700); err != nil {
		return nil, err
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return nil, fmt.Errorf("attach %s at %s: %w", dir.Name(), target, err)
	}
	fd, _, err := openBeneath(unix.AT_FDCWD, target, false, false, identity{})
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), dir.Name()), nil
}

// unstage detaches everything mounted in a stage directory and removes
// it. Idempotent.
//
// A stage's mounts are on its entries (fs, h<n>, agent-bin, netns), each
// detached with what lies below it, so the mount table is not read: it
// holds every session's stage, and reading it for each of them made
// stopping many sessions quadratic. Should an entry not come off that way,
// the table says what else is mounted in the stage (deepest first).
func unstage(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if clearStage(dir) == nil {
		return nil
	}
	err := detachUnder("/proc/thread-self/mountinfo", dir)
	return errors.Join(err, clearStage(dir))
}

// clearStage detaches the mounts on each entry of a stage directory and
// removes the entries and the directory.
func clearStage(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		detachStacked(p)
		// Only empty mount points are removed (rmdir, never a recursive
		// delete): should anything still be mounted, its files are the
		// caller's host directory.
		rm := unix.Rmdir
		if !e.IsDir() {
			rm = unix.Unlink // the network namespace's pin, the agent's binary
		}
		if e.Name() == agentHostDir {
			// The agent's socket an earlier boxrt left.
			_ = unix.Unlink(filepath.Join(p, sandboxagent.SocketName))
		}
		if err := rm(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	if err := unix.Rmdir(dir); err != nil && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	return errors.Join(errs...)
}

// maxStacked bounds the mounts detachStacked takes off one mount point.
const maxStacked = 8

// detachStacked lazily detaches the mounts stacked on mount point p, each
// with every mount below it, until p is no mount point (EINVAL).
func detachStacked(p string) {
	for range maxStacked {
		if unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) != nil {
			return
		}
	}
}

// detachUnder detaches every mount below dir in the namespace whose
// mountinfo is given, deepest first. Lazily: a loop device then goes with
// its last user.
func detachUnder(mountinfo, dir string) error {
	mounts, err := mountsUnder(mountinfo, dir)
	if err != nil {
		return err
	}
	slices.SortFunc(mounts, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	var errs []error
	for _, m := range mounts {
		// EINVAL/ENOENT: gone already (a stage removed meanwhile takes the
		// copies of its mounts with it).
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points strictly below dir.
func mountsUnder(mountinfo, dir string) ([]string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 {
			if p := unescapeMount(fields[4]); strings.HasPrefix(p, dir+"/") {
				out = append(out, p)
			}
		}
	}
	return out, sc.Err()
}

// restrict makes a directory boxrt owns traversable by the sandbox user
// alone (root:<sandbox group> 0710).
func (b *Backend) restrict(dirfd int, name string) error {
	if b.id.cred == nil {
		return nil
	}
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.Fchownat(dirfd, name, 0, b.id.gid, flags); err != nil {
		return err
	}
	// fchmodat cannot take AT_EMPTY_PATH before Linux 6.6; /proc/self/fd
	// reaches the directory itself without a path lookup.
	p := name
	if name == "" {
		p = "/proc/self/fd/" + strconv.Itoa(dirfd)
		dirfd = unix.AT_FDCWD
	}
	return unix.Fchmodat(dirfd, p, 0o710, 0)
}
