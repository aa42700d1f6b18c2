package bwrap

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair in the sandbox's own devpts (bwrap
// mounts a new instance at /dev/pts), so that inside, the command's
// terminal has a name (/dev/pts/N) as on any machine, while the host's
// terminals stay out of its reach. boxrt opens the master itself, through
// the root of the sandbox's init with RESOLVE_IN_ROOT and no symlinks
// followed, so nothing the sandbox plants leads elsewhere, and checks that
// it got a ptmx; the slave comes from the master (TIOCGPTPEER), not from a
// path.
func (m *machine) openPTY() (master, slave *os.File, err error) {
	root, err := m.r.openRoot()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(root)
	mfd, err := unix.Openat2(root, "dev/pts/ptmx", &unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open the sandbox's /dev/pts/ptmx: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(mfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
		unix.Major(st.Rdev) != 5 || unix.Minor(st.Rdev) != 2 {
		unix.Close(mfd)
		return nil, nil, errors.New("the sandbox's /dev/pts/ptmx is not a terminal multiplexer")
	}
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("unlock the pseudo-terminal: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("open the pseudo-terminal's slave: %w", errno)
	}
	// Non-blocking: the master is read through the runtime's poller, so
	// read deadlines (execIO.ended) work.
	return os.NewFile(uintptr(mfd), "/dev/ptmx"), os.NewFile(sfd, "pty"), nil
}

// openRoot opens (O_PATH) the root directory of the sandbox's namespace
// init, bwrap's only child. The pid is trusted only while init is still
// that child after the open: a pid cannot be recycled before its parent
// reaps it.
func (r *run) openRoot() (int, error) {
	r.mu.Lock()
	cmd := r.cmd
	r.mu.Unlock()
	if cmd == nil {
		return -1, errors.New("the sandbox is not running")
	}
	outer := cmd.Process.Pid
	kids := children(outer)
	if len(kids) != 1 {
		return -1, errors.New("the sandbox's init is not running")
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/root", kids[0]), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the sandbox's root: %w", err)
	}
	if ppidOf(kids[0]) != outer || cmd.Process.Signal(unix.Signal(0)) != nil {
		unix.Close(fd)
		return -1, errors.New("the sandbox's init is gone")
	}
	return fd, nil
}
