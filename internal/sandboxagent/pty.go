package sandboxagent

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a pseudo-terminal pair in the devpts instance a sandbox
// mounts at /dev/pts, given the sandbox's root directory (an O_PATH
// descriptor the caller opened through /proc/<pid>/root of a process it
// knows is the sandbox's). Inside, the command's terminal then has a name
// (/dev/pts/N) as on any machine, and the host's terminals stay out of
// the sandbox's reach. The master is opened with RESOLVE_IN_ROOT and no
// symlinks followed, so nothing the sandbox plants leads elsewhere, and is
// checked to be a terminal multiplexer; the slave comes from the master
// (TIOCGPTPEER), not from a path. The master is non-blocking, so that it
// is read through the runtime's poller and read deadlines work.
func OpenPTY(root int) (master, slave *os.File, err error) {
	mfd, err := unix.Openat2(root, "dev/pts/ptmx", &unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open the sandbox's /dev/pts/ptmx: %w", err)
	}
	return ptyOf(mfd)
}

// ptyOf checks that mfd is a terminal multiplexer and returns the new
// pseudo-terminal's master (mfd) and slave. It owns mfd.
func ptyOf(mfd int) (master, slave *os.File, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(mfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
		unix.Major(st.Rdev) != 5 || unix.Minor(st.Rdev) != 2 {
		unix.Close(mfd)
		return nil, nil, errors.New("the sandbox's ptmx is not a terminal multiplexer")
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
	return os.NewFile(uintptr(mfd), "/dev/ptmx"), os.NewFile(sfd, "pty"), nil
}
