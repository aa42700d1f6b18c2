package sandboxagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// SocketName is the name of the socket Listen creates in its directory.
const SocketName = "agent.sock"

// answerTimeout bounds every wait for the agent: its hello after it
// connected, its answer to a spawn.
const answerTimeout = 5 * time.Second

// Listener is a session's listening socket.
type Listener struct {
	ln  *net.UnixListener
	dir *os.File // O_PATH: the socket is named and removed relative to it
	ino uint64   // the socket file's: Close removes this one only
	// timeout is answerTimeout; tests shorten it.
	timeout  time.Duration
	acceptMu sync.Mutex
}

// Listen creates the listening socket dir/agent.sock (mode 0666, so that
// the sandbox user can connect), removing a stale socket file an earlier
// boxrt left there. dir may be of any length: the socket is bound through
// /proc/self/fd, never by its full path (sun_path holds 108 bytes).
func Listen(dir string) (*Listener, error) {
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("agent socket directory: %w", err)
	}
	ln, ino, err := listenIn(d)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("agent socket in %s: %w", dir, err)
	}
	return &Listener{ln: ln, dir: d, ino: ino, timeout: answerTimeout}, nil
}

// listenIn binds and listens on d's SocketName and returns the socket
// file's inode number.
func listenIn(d *os.File) (*net.UnixListener, uint64, error) {
	dirfd := int(d.Fd())
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, SocketName, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFSOCK:
		return nil, 0, fmt.Errorf("%s exists and is not a socket; remove it", SocketName)
	case err == nil:
		// A boxrt that died left it; nothing listens on it any more
		// (the state directory's lock keeps a second boxrt out).
		if err := unix.Unlinkat(dirfd, SocketName, 0); err != nil {
			return nil, 0, fmt.Errorf("removing the stale socket: %w", err)
		}
	case !errors.Is(err, unix.ENOENT):
		return nil, 0, err
	}
	path := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + SocketName
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, 0, err
	}
	// The path it was bound by means nothing once dirfd is closed: Close
	// removes the socket through the directory instead.
	ln.SetUnlinkOnClose(false)
	err = unix.Fchmodat(dirfd, SocketName, 0o666, 0)
	if err == nil {
		err = unix.Fstatat(dirfd, SocketName, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		ln.Close()
		unix.Unlinkat(dirfd, SocketName, 0)
		return nil, 0, err
	}
	return ln, st.Ino, nil
}

// Accept waits for an agent to connect and say a valid hello (at most 5 s
// after it connected) and returns its connection. A connection whose hello
// is wrong is closed and its *ProtocolError returned; the caller decides
// whether to accept again.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	l.acceptMu.Lock()
	defer l.acceptMu.Unlock()
	if err := l.ln.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { l.ln.SetDeadline(time.Unix(1, 0)) })
	c, err := l.ln.AcceptUnix()
	stop()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	fc := newFrameConn(c, false)
	pid, err := readHello(ctx, fc, l.timeout)
	if err != nil {
		c.Close()
		return nil, err
	}
	return newConn(fc, pid, peerPID(c), l.timeout), nil
}

// peerPID is the connected process's pid from the kernel, 0 if unknown.
func peerPID(c *net.UnixConn) int {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return 0
	}
	return int(cred.Pid)
}

// readHello reads the agent's first frame, which must be a valid hello.
func readHello(ctx context.Context, fc *frameConn, timeout time.Duration) (int, error) {
	if err := fc.c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	stop := context.AfterFunc(ctx, func() { fc.c.SetReadDeadline(time.Unix(1, 0)) })
	payload, err := fc.readFrame()
	stop()
	switch {
	case ctx.Err() != nil:
		return 0, ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, &ProtocolError{Reason: fmt.Sprintf("no hello within %s of connecting", timeout)}
	case err != nil:
		return 0, readError(err)
	}
	var h helloMsg
	if op, err := opOf(payload); err != nil {
		return 0, err
	} else if op != opHello {
		return 0, &ProtocolError{Reason: "first frame is " + short(op) + ", want hello"}
	}
	if err := decodeStrict(opHello, payload, &h); err != nil {
		return 0, err
	}
	if err := h.validate(); err != nil {
		return 0, &ProtocolError{Reason: "hello: " + err.Error()}
	}
	return h.PID, fc.c.SetReadDeadline(time.Time{})
}

// readError is the error of a failed frame read: a *ProtocolError as is,
// anything else the connection's loss.
func readError(err error) error {
	var pe *ProtocolError
	if errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrAgentLost, err)
}

// Close stops listening and removes the socket file, unless another
// Listener has since replaced it. Connections it accepted stay open.
func (l *Listener) Close() error {
	err := l.ln.Close()
	dirfd := int(l.dir.Fd())
	var st unix.Stat_t
	if unix.Fstatat(dirfd, SocketName, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Ino == l.ino {
		if uerr := unix.Unlinkat(dirfd, SocketName, 0); uerr != nil && err == nil {
			err = uerr
		}
	}
	l.dir.Close()
	return err
}
