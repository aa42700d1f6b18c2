package docker

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
)

var _ backends.ExecPrestarter = (*Backend)(nil)

// prestarted is an exec started ahead of its command (see
// sandboxsh.PrestartScript), waiting for its line on the hijacked stream.
// Its connection is boxrt's: when it closes (End, or boxrt's exit) the
// shell reads EOF before a line and exits, so nothing is left running.
type prestarted struct {
	id string
	hj types.HijackedResponse
}

func (p *prestarted) End() { p.hj.Close() }

// alive reports whether the exec still waits for its line. Its stream,
// open and silent while the shell waits, is closed by the engine once the
// exec's process has ended; a peek at the socket sees that without an
// Engine API call (an exec inspect is ~1 ms, a tenth of a command run this
// way) and no later than an inspect would. A stream that is not a plain
// socket (TLS to a remote engine) is asked about with the inspect.
func (b *Backend) alive(ctx context.Context, p *prestarted) bool {
	if open, known := streamOpen(p.hj); known {
		return open
	}
	ins, err := b.cli.ContainerExecInspect(ctx, p.id)
	return err == nil && ins.Running
}

// streamOpen peeks at hj's socket without blocking: open when nothing is
// there to read yet; known is false when hj is not a socket.
func streamOpen(hj types.HijackedResponse) (open, known bool) {
	if hj.Reader.Buffered() > 0 {
		return false, true // it printed: not a shell waiting for its line
	}
	sc, ok := hj.Conn.(syscall.Conn)
	if !ok {
		return false, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var peekErr error
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, peekErr = unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		return true // one look, never a wait
	})
	return err == nil && errors.Is(peekErr, unix.EAGAIN), true
}

// PrestartExec implements backends.ExecPrestarter: the container's next
// plain exec runs in an exec started now (or already on its way: every
// plain exec starts the next one, see Exec).
func (b *Backend) PrestartExec(ctx context.Context, info backends.Session) error {
	if l, err := b.link(ctx, info); err != nil || l != nil {
		return err // an agent starts a command without an Engine call
	}
	return b.prestartNext(info)(ctx)
}

// prestartNext starts, in the background, the exec the container's next
// plain exec will run in, unless one is there or on its way, and returns
// the wait for it. Starting an exec (runc joining the container's
// namespaces and cgroups) is most of a warm exec's time; done between
// commands, it is off the next one's path.
func (b *Backend) prestartNext(info backends.Session) (wait func(context.Context) error) {
	name := info.BackendSessionID
	return b.prestarts.Start(b.background, name, func(ctx context.Context) (*prestarted, error) {
		ctx, cancel := context.WithTimeout(ctx, helperTimeout)
		defer cancel()
		created, err := b.cli.ContainerExecCreate(ctx, name, container.ExecOptions{
			AttachStdin:  true,
			AttachStdout: true,
			AttachStderr: true,
			WorkingDir:   "/",
			Cmd:          []string{"sh", "-c", sandboxsh.PrestartScript, "boxrt-exec"},
		})
		if err != nil {
			return nil, b.sessionError(info, "prestarting an exec in "+name, err)
		}
		hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
		if err != nil {
			return nil, b.sessionError(info, "prestarting an exec in "+name, err)
		}
		return &prestarted{id: created.ID, hj: hj}, nil
	})
}

// usePrestarted hands args (ExecScript's) to the container's prestarted
// exec and returns it, started, waiting for one still starting; ok is
// false when there is none that can serve req (which then starts an exec
// as usual), and one that cannot is ended: it is only for a plain exec.
func (b *Backend) usePrestarted(ctx context.Context, name string, req backends.ExecRequest, args ...string) (_ *prestarted, ok bool) {
	line, fits := sandboxsh.PrestartLine(args...)
	if !req.Plain() || !fits {
		b.prestarts.Drop(name)
		return nil, false
	}
	p, ok := b.prestarts.Take(ctx, name)
	if !ok {
		return nil, false
	}
	// One that ended meanwhile (its container restarted, a process killed
	// it) would swallow the line and answer nothing.
	if !b.alive(ctx, p) {
		p.End()
		return nil, false
	}
	// A line cut short ends it before anything runs: read fails at EOF.
	_ = p.hj.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := p.hj.Conn.Write(line); err != nil {
		p.End()
		return nil, false
	}
	_ = p.hj.Conn.SetWriteDeadline(time.Time{})
	return p, true
}
