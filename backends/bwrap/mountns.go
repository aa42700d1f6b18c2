package bwrap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Every session stages a few mounts in boxrt's mount namespace (its disk,
// the agent binary, its network namespace's pin, the caller's directories:
// stage.go), and a new mount namespace starts as a copy of the one it is
// cloned from. Were bwrap cloned from boxrt's, every sandbox would copy the
// stages of all sessions, and bwrap re-reads /proc/self/mountinfo for each
// of its binds: with 1000 sessions a new sandbox took 335 ms instead of
// 21 ms (a minimal bwrap 5.4 → 50 ms with 2000 extra mounts). So bwrap is
// born in a namespace of its own session: a copy of the launch template
// (boxrt's namespace as it was without any stage, made once) into which
// clones of that one session's staged mounts are attached. Its size does
// not depend on how many sessions exist.
//
// The template is private (nothing propagates into it from boxrt's
// namespace, so no stage mounted later appears there): a sandbox sees the
// host's system directories as they were mounted when boxrt started its
// first sandbox; the caller's directories come through the stage, current.

// The main thread stays home: what /proc/self shows (mountinfo, ns/*,
// net) is the main thread's, which boxrt and its tests read as boxrt's
// own. Locked to the main goroutine from init, it never runs one of the
// goroutines that take their thread into a sandbox's namespaces for a
// moment (startOnThread, launchTemplate).
func init() { runtime.LockOSThread() }

// launchTemplate returns the template namespace (made on first use).
func (b *Backend) launchTemplate() (int, error) {
	b.launchOnce.Do(func() {
		c := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			err := b.makeLaunchTemplate()
			if errors.Is(err, errThreadAway) {
				c <- err
				select {} // parked: the thread is in no namespace boxrt's work may run in
			}
			runtime.UnlockOSThread()
			c <- err
		}()
		b.launchErr = <-c
	})
	return b.launchNS, b.launchErr
}

// makeLaunchTemplate makes a private copy of boxrt's mount namespace
// without anything under stageRoot and keeps it in b.launchNS. The
// calling thread is locked; it ends back home.
func (b *Backend) makeLaunchTemplate() (err error) {
	goHome, err := awayFromHome()
	if err != nil {
		return err
	}
	defer func() {
		if herr := goHome(); herr != nil {
			err = errors.Join(err, fmt.Errorf("%w: %w", errThreadAway, herr))
		}
	}()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the launch namespace private: %w", err)
	}
	if err := detachUnder("/proc/thread-self/mountinfo", stageRoot); err != nil {
		return fmt.Errorf("the launch namespace: %w", err)
	}
	fd, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the launch namespace: %w", err)
	}
	b.launchNS = fd
	return nil
}

// awayFromHome gives the calling locked thread a filesystem context of
// its own (so it may change mount namespace) and returns how to bring it
// back to boxrt's mount namespace and working directory.
func awayFromHome() (goHome func() error, err error) {
	home, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open boxrt's mount namespace: %w", err)
	}
	cwd, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(home)
		return nil, fmt.Errorf("open the working directory: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		unix.Close(home)
		unix.Close(cwd)
		return nil, fmt.Errorf("unshare the filesystem context: %w", err)
	}
	return func() error {
		defer unix.Close(home)
		defer unix.Close(cwd)
		if err := unix.Setns(home, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("return to boxrt's mount namespace: %w", err)
		}
		if err := unix.Fchdir(cwd); err != nil {
			return fmt.Errorf("return to the working directory: %w", err)
		}
		return nil
	}, nil
}

// enterSessionMounts moves the calling locked thread into a new copy of
// the launch template with the stage's mounts attached at their paths,
// and returns how to bring it back.
func (b *Backend) enterSessionMounts(stage string) (goHome func() error, err error) {
	tmpl, err := b.launchTemplate()
	if err != nil {
		return nil, err
	}
	trees, err := cloneStageMounts(stage)
	defer func() {
		for _, t := range trees {
			unix.Close(t.fd)
		}
	}()
	if err != nil {
		return nil, err
	}
	if goHome, err = awayFromHome(); err != nil {
		return nil, err
	}
	if err := enterCopyWith(tmpl, trees); err != nil {
		if herr := goHome(); herr != nil {
			return nil, errors.Join(err, fmt.Errorf("%w: %w", errThreadAway, herr))
		}
		return nil, err
	}
	return goHome, nil
}

// stagedTree is a detached clone of one of a stage's mounts.
type stagedTree struct {
	fd     int
	target string
}

// cloneStageMounts clones each mount at an entry of the stage (its disk,
// agent binary, network namespace, host directories). Each is cloned on
// its own: a recursive clone of the stage directory, which is no mount
// point, would walk every mount of the filesystem it lies on — boxrt's
// whole table — to find the few below it.
func cloneStageMounts(stage string) ([]stagedTree, error) {
	entries, err := os.ReadDir(stage)
	if err != nil {
		return nil, fmt.Errorf("read the stage: %w", err)
	}
	var trees []stagedTree
	for _, e := range entries {
		p := filepath.Join(stage, e.Name())
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_NLINK, &stx); err != nil {
			return trees, fmt.Errorf("stat %s: %w", p, err)
		}
		if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
			return trees, fmt.Errorf("stat %s: the kernel does not say which files are mount points", p)
		}
		// Nlink 0: a clone of a host directory removed since, which the
		// session no longer binds (it stages the new one) and which the
		// kernel would not attach (its root is unlinked).
		if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 || stx.Nlink == 0 {
			continue
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return trees, fmt.Errorf("clone %s: %w", p, err)
		}
		trees = append(trees, stagedTree{fd: fd, target: p})
	}
	return trees, nil
}

// enterCopyWith enters a new copy of the template namespace and attaches
// the detached trees in it.
func enterCopyWith(tmpl int, trees []stagedTree) error {
	if err := unix.Setns(tmpl, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("enter the launch namespace: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("copy the launch namespace: %w", err)
	}
	for _, t := range trees {
		if err := unix.MoveMount(t.fd, "", unix.AT_FDCWD, t.target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("attach %s: %w", t.target, err)
		}
	}
	return nil
}
