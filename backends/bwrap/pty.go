package bwrap

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// openPTY opens a pseudo-terminal pair in the sandbox's own devpts (bwrap
// mounts a new instance at /dev/pts), through the root of the sandbox's
// namespace init.
func (m *machine) openPTY() (master, slave *os.File, err error) {
	root, err := m.r.openRoot()
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(root)
	return sandboxagent.OpenPTY(root)
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
