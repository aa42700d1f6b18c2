package docker

import (
	"context"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
)

var _ backends.ExecPrestarter = (*Backend)(nil)

// prestarted is an exec started ahead of its command (see
// sandboxsh.PrestartScript), waiting for its line on the hijacked stream.
type prestarted struct {
	id string
	hj types.HijackedResponse
}

// prestarts holds at most one prestarted exec per container. Its
// connections are boxrt's: one left unused ends when it is closed (EOF
// before a line), so a crash of boxrt leaves nothing running.
type prestarts struct {
	mu sync.Mutex
	m  map[string]*prestarted
}

// PrestartExec implements backends.ExecPrestarter: the container's next
// plain exec without environment runs in an exec started now.
func (b *Backend) PrestartExec(ctx context.Context, info backends.Session) error {
	name := info.BackendSessionID
	created, err := b.cli.ContainerExecCreate(ctx, name, container.ExecOptions{
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		WorkingDir:   "/",
		Cmd:          []string{"sh", "-c", sandboxsh.PrestartScript, "boxrt-exec"},
	})
	if err != nil {
		return b.sessionError(info, "prestarting an exec in "+name, err)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return b.sessionError(info, "prestarting an exec in "+name, err)
	}
	b.prestarts.mu.Lock()
	if b.prestarts.m == nil {
		b.prestarts.m = map[string]*prestarted{}
	}
	old := b.prestarts.m[name]
	b.prestarts.m[name] = &prestarted{id: created.ID, hj: hj}
	b.prestarts.mu.Unlock()
	if old != nil {
		old.hj.Close()
	}
	return nil
}

// takePrestarted removes the container's prestarted exec from the table.
func (b *Backend) takePrestarted(name string) *prestarted {
	b.prestarts.mu.Lock()
	defer b.prestarts.mu.Unlock()
	p := b.prestarts.m[name]
	delete(b.prestarts.m, name)
	return p
}

// dropPrestarted ends the container's prestarted exec, if any.
func (b *Backend) dropPrestarted(name string) {
	if p := b.takePrestarted(name); p != nil {
		p.hj.Close()
	}
}

// closePrestarted ends every prestarted exec (the backend is closing).
func (b *Backend) closePrestarted() {
	b.prestarts.mu.Lock()
	all := b.prestarts.m
	b.prestarts.m = nil
	b.prestarts.mu.Unlock()
	for _, p := range all {
		p.hj.Close()
	}
}

// usePrestarted hands args (ExecScript's) to the container's prestarted
// exec and returns it, started; ok is false when there is none that can
// serve req (which then starts an exec as usual), and one that cannot is
// ended: it is only for a plain exec that sets no environment.
func (b *Backend) usePrestarted(ctx context.Context, name string, req backends.ExecRequest, args ...string) (_ *prestarted, ok bool) {
	p := b.takePrestarted(name)
	if p == nil {
		return nil, false
	}
	plain := req.Stdin == nil && req.TTY == nil && req.Signals == nil && len(req.Env) == 0
	line, fits := sandboxsh.PrestartLine(args...)
	if !plain || !fits {
		p.hj.Close()
		return nil, false
	}
	// One that ended meanwhile (its container restarted, a process killed
	// it) would swallow the line and answer nothing.
	if ins, err := b.cli.ContainerExecInspect(ctx, p.id); err != nil || !ins.Running {
		p.hj.Close()
		return nil, false
	}
	// A line cut short ends it before anything runs: read fails at EOF.
	_ = p.hj.Conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
	if _, err := p.hj.Conn.Write(line); err != nil {
		p.hj.Close()
		return nil, false
	}
	_ = p.hj.Conn.SetWriteDeadline(time.Time{})
	return p, true
}
