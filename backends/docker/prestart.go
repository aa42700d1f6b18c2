package docker

import (
	"context"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"

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

// PrestartExec implements backends.ExecPrestarter: the container's next
// plain exec runs in an exec started now (or already on its way: every
// plain exec starts the next one, see Exec).
func (b *Backend) PrestartExec(ctx context.Context, info backends.Session) error {
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
	if ins, err := b.cli.ContainerExecInspect(ctx, p.id); err != nil || !ins.Running {
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
