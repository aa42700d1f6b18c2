package sandboxagent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A terminal the agent makes and relays, for a sandbox whose kernel does
// not take a terminal passed from the host: gVisor (runsc 20221219) fails
// the child's TIOCSCTTY on a host pty with ENOTTY (measured), while its
// own devpts works. The agent opens /dev/ptmx in the sandbox, runs the
// child on the slave as its controlling terminal, and copies bytes between
// the master and the two pipes the host sent: the stdin pipe's read end
// into the master, the master into the output pipe's write end. It copies
// and nothing else: one bounded buffer per direction, no parsing. The host
// reads a plain pipe and bounds the output as it bounds any.

const (
	// relayBuf is what a relay holds per direction.
	relayBuf = 32 << 10
	// drainQuiet: once the command exited, its terminal's output is
	// relayed until it has been quiet this long, or the terminal reads as
	// hung up (Linux: every slave closed). gVisor's master never reads
	// as hung up (measured), so the command's exit is what ends it there;
	// what it wrote before exiting is queued by then.
	drainQuiet = 100 * time.Millisecond
)

// relay is one command's terminal. It ends (and closes the master and
// both pipes) when the output is drained after the command's exit, when
// writing the output fails (the host closed its end) or when the stdin
// pipe reads EOF (the host is done with the command): as when a host
// closes a terminal's master, the command sees a hangup.
type relay struct {
	master  *os.File
	slave   int // the agent's copy, closed once the child has its own
	in, out *os.File
	started bool

	exited   chan struct{}
	exitOnce sync.Once
	shutOnce sync.Once
}

// openRelay makes the terminal of a spawn of size, with fds (the stdin
// pipe's read end, the output pipe's write end; spawn closes them, the
// relay keeps duplicates), and sets attr to run the child on its slave
// as its controlling terminal.
func openRelay(size *termSize, fds []int, attr *syscall.ProcAttr) (_ *relay, err error) {
	r := &relay{slave: -1, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			r.release()
		}
	}()
	if r.master, r.slave, err = openTerminal(); err != nil {
		return nil, err
	}
	if r.in, err = pollable(fds[0], "stdin"); err != nil {
		return nil, err
	}
	if r.out, err = pollable(fds[1], "output"); err != nil {
		return nil, err
	}
	if err := r.resize(size); err != nil {
		return nil, fmt.Errorf("size the terminal: %v", err)
	}
	attr.Files = []uintptr{uintptr(r.slave), uintptr(r.slave), uintptr(r.slave)}
	attr.Sys.Setctty, attr.Sys.Ctty = true, 0
	return r, nil
}

// openTerminal opens a pseudo-terminal pair in the sandbox's devpts. The
// slave comes from the master (TIOCGPTPEER) where the kernel has it, else
// by its number (gVisor). The master is non-blocking, for the runtime's
// poller: closing it ends a read or write in progress.
func openTerminal() (*os.File, int, error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open /dev/ptmx: %v", err)
	}
	master := os.NewFile(uintptr(mfd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, -1, fmt.Errorf("unlock the terminal: %v", err)
	}
	slave, err := openSlave(mfd)
	if err != nil {
		master.Close()
		return nil, -1, err
	}
	return master, slave, nil
}

func openSlave(mfd int) (int, error) {
	const flags = unix.O_RDWR | unix.O_NOCTTY | unix.O_CLOEXEC
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, flags)
	if errno == 0 {
		return int(sfd), nil
	}
	n, err := unix.IoctlGetInt(mfd, unix.TIOCGPTN)
	if err != nil {
		return -1, fmt.Errorf("the terminal's number: %v", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/dev/pts/%d", n), flags, 0)
	if err != nil {
		return -1, fmt.Errorf("open the terminal's slave: %v", err)
	}
	if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("/dev/pts/%d is not a terminal: %v", n, err)
	}
	return fd, nil
}

// pollable duplicates fd, a pipe's end, as a non-blocking file, so that
// closing it ends a read or write in progress. The flag is the agent's
// own file description's: the host's end of the pipe is another.
func pollable(fd int, name string) (*os.File, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("the %s pipe: %v", name, err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		unix.Close(dup)
		return nil, fmt.Errorf("the %s pipe: %v", name, err)
	}
	return os.NewFile(uintptr(dup), name), nil
}

// start relays once the child runs.
func (r *relay) start() {
	r.started = true
	go r.input()
	go r.output()
}

// release closes the agent's copy of the slave, and the whole relay if it
// never started (the spawn failed). Nil-safe.
func (r *relay) release() {
	if r == nil {
		return
	}
	if r.slave >= 0 {
		unix.Close(r.slave)
		r.slave = -1
	}
	if !r.started {
		r.shut()
	}
}

func (r *relay) shut() {
	r.shutOnce.Do(func() {
		for _, f := range []*os.File{r.master, r.in, r.out} {
			if f != nil {
				f.Close()
			}
		}
	})
}

// input copies the host's stdin pipe to the terminal until EOF, which
// hangs the terminal up.
func (r *relay) input() {
	defer r.shut()
	_, _ = io.CopyBuffer(onlyWriter{r.master}, onlyReader{r.in}, make([]byte, relayBuf))
}

// output copies the terminal to the host's output pipe.
func (r *relay) output() {
	defer r.shut()
	buf := make([]byte, relayBuf)
	for {
		n, err := r.master.Read(buf)
		if n > 0 {
			if _, werr := r.out.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // hung up (EIO), shut, or quiet for drainQuiet after the exit
		}
		select {
		case <-r.exited:
			_ = r.master.SetReadDeadline(time.Now().Add(drainQuiet))
		default:
		}
	}
}

// childExited starts the drain: the output ends once quiet.
func (r *relay) childExited() {
	r.exitOnce.Do(func() {
		close(r.exited)
		_ = r.master.SetReadDeadline(time.Now().Add(drainQuiet))
	})
}

// resize sets the terminal's size (the kernel tells the command with
// SIGWINCH); a relay that ended has nothing to size.
func (r *relay) resize(size *termSize) error {
	rc, err := r.master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)})
	})
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	if err != nil {
		return err
	}
	return ioErr
}

// onlyWriter and onlyReader hide os.File's ReadFrom and WriteTo from
// io.CopyBuffer: a relay copies through its own buffer (no splice into a
// terminal).
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

// resizeTerm answers m: the terminal of m's process is sized if the agent
// made one for it (a relayed one, or a stream-mode process's), and the
// host is told resized either way (a terminal
// that is gone has no size to wait for). A size out of range breaks the
// protocol.
func (a *agent) resizeTerm(m *resizeMsg) error {
	if err := m.termSize.validate(); err != nil {
		return &ProtocolError{Reason: fmt.Sprintf("resize %d: %v", m.ID, err)}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if pid, ok := a.ids[m.ID]; ok && a.live[pid] == m.ID {
		if r := a.relays[pid]; r != nil {
			if err := r.resize(&m.termSize); err != nil {
				fmt.Fprintf(os.Stderr, "boxrt agent: resize %d: %v\n", m.ID, err)
			}
		}
	}
	if sp := a.streams[m.ID]; sp != nil && sp.tty {
		setSize(sp.outs[0], uint16(m.Rows), uint16(m.Cols))
	}
	return a.sendLocked(resizedMsg{Op: opResized, ID: m.ID})
}

// relayExited tells pid's relay, if it has one, that the command exited.
// Locked.
func (a *agent) relayExited(pid int) {
	if r := a.relays[pid]; r != nil {
		delete(a.relays, pid)
		r.childExited()
	}
}
