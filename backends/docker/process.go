package docker

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// StartProcess implements backends.Backend: a managed process is an exec
// with stdin attached and no TTY, so its stdout is a clean byte stream.
//
// Callers must keep reading both Stdout and Stderr until EOF: they are fed
// by one demultiplexing goroutine through unbuffered pipes, so an unread
// stream stalls the other and Wait.
func (b *Backend) StartProcess(ctx context.Context, info backends.Session, spec backends.ProcessSpec) (backends.Process, error) {
	if strings.TrimSpace(spec.Command) == "" {
		return nil, boxerr.Validation("command", "command must not be empty")
	}
	spec.Env = b.execEnv(info.BackendSessionID, spec.Env)
	if b.processUser == "" {
		// Another process user needs an Engine exec: the agent runs as
		// the sessions' user and cannot change it.
		if l, err := b.link(ctx, info); err != nil {
			return nil, err
		} else if l != nil {
			return b.agentStartProcess(ctx, info, l, spec)
		}
	}
	cwd, pidFile := execproc.Paths(info, spec.Cwd, "proc", b.pidDirOf(info.BackendSessionID))
	cmd := append([]string{"sh", "-c", procScript, "boxrt-proc", cwd, pidFile, spec.Command}, spec.Args...)
	env := spec.Env
	if b.processUser != "" {
		if _, ok := env["HOME"]; !ok {
			// The process user owns no home directory in the image; tools
			// that cache under $HOME (npm, pip) need a writable one.
			env = maps.Clone(env)
			if env == nil {
				env = map[string]string{}
			}
			env["HOME"] = "/tmp"
		}
	}
	created, err := b.cli.ContainerExecCreate(ctx, info.BackendSessionID, container.ExecOptions{
		// Another user than the execs': they share the container's
		// /proc, and the same user could read the process's environment
		// (its secrets) from /proc/<pid>/environ.
		User:         b.processUser,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Env:          envList(env),
		WorkingDir:   "/",
		Cmd:          cmd,
	})
	if err != nil {
		return nil, b.sessionError(info, "creating managed process in "+info.BackendSessionID, err)
	}
	hj, err := b.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{})
	if err != nil {
		return nil, b.sessionError(info, "starting managed process in "+info.BackendSessionID, err)
	}
	stdin := &processStdin{conn: hj.Conn}
	proc, outW, errW := execproc.New(stdin)
	p := &process{
		Proc:      proc,
		b:         b,
		container: info.BackendSessionID,
		execID:    created.ID,
		pidFile:   pidFile,
		hj:        hj,
		stdin:     stdin,
	}
	exited, stopWatch := b.exitWatch(context.WithoutCancel(ctx), info)
	go func() {
		defer stopWatch()
		select {
		case <-exited:
			// The stream would never end by itself (see exitWatch).
			_ = hj.Conn.Close()
		case <-p.Done():
		}
	}()
	go func() { p.Finish(p.run(outW, errW)) }()
	return p, nil
}

type process struct {
	*execproc.Proc
	b         *Backend
	container string
	execID    string
	pidFile   string
	hj        types.HijackedResponse
	stdin     *processStdin // also Proc's Stdin
}

// Signal delivers sig to every process of the managed process's tree inside
// the container. Signalling a process that has already exited is a no-op.
func (p *process) Signal(sig syscall.Signal) error {
	name, ok := signalNames[sig]
	if !ok {
		return boxerr.Validation("signal", "unsupported signal %d", int(sig))
	}
	if p.Exited() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	return p.b.signalSession(ctx, p.container, p.b.processUser, p.pidFile, name, false)
}

// run streams the process and returns its outcome for Finish. The engine
// reports a process killed by signal n as 128+n, like a shell; run turns
// 129..192 back into -n so a killed process reads as the reference (and
// os/exec) report it. A process that really exits with such a code is
// indistinguishable and reads as killed.
func (p *process) run(outW, errW *io.PipeWriter) (int, error) {
	s := newStream(&p.hj, false, outW, errW)
	<-s.done
	// Readers get EOF (or the stream's error) as soon as output ends, not
	// after the bookkeeping below.
	outW.CloseWithError(s.err)
	errW.CloseWithError(s.err)
	p.stdin.markDone()
	s.close()

	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	if s.err != nil {
		// The output can no longer be delivered (a reader went away or the
		// engine connection broke): do not leave the process running blind.
		_ = p.b.signalSession(ctx, p.container, p.b.processUser, p.pidFile, "KILL", false)
	}
	code, err := p.b.execExitCode(ctx, p.execID)
	// Whatever the process left running in its session dies with it, and
	// its pid file goes.
	_ = p.b.signalSession(ctx, p.container, p.b.processUser, p.pidFile, "KILL", true)
	if err != nil {
		return -1, p.b.apiError("reading managed process exit code", err)
	}
	return signalExitCode(code), nil
}

// processStdin writes to the exec's stdin. Close half-closes the engine
// connection, which the engine turns into EOF on the process's stdin while
// its output keeps flowing.
type processStdin struct {
	conn   net.Conn
	closed atomic.Bool
	ended  atomic.Bool
	once   sync.Once
	err    error
}

func (w *processStdin) Write(b []byte) (int, error) {
	if w.closed.Load() || w.ended.Load() {
		return 0, io.ErrClosedPipe
	}
	n, err := w.conn.Write(b)
	if err != nil && w.ended.Load() {
		err = io.ErrClosedPipe
	}
	return n, err
}

func (w *processStdin) Close() error {
	w.once.Do(func() {
		w.closed.Store(true)
		if w.ended.Load() {
			return
		}
		cw, ok := w.conn.(interface{ CloseWrite() error })
		if !ok {
			w.err = boxerr.Failure("the Docker engine connection cannot be half-closed; stdin EOF cannot be delivered")
			return
		}
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) && !w.ended.Load() {
			w.err = err
		}
	})
	return w.err
}

// SetWriteDeadline bounds Write like the connection's own deadline, so the
// relay can give up on a process that stopped reading its stdin.
func (w *processStdin) SetWriteDeadline(t time.Time) error { return w.conn.SetWriteDeadline(t) }

func (w *processStdin) markDone() { w.ended.Store(true) }
