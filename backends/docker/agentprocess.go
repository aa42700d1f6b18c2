package docker

import (
	"context"
	"errors"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// agentStartProcess starts a managed process through the container's
// agent, with pipes of boxrt's for its stdio. It still runs in ProcScript
// so that its pid file lets a later boxrt kill it (see killOrphans): its
// pipes end with this boxrt.
func (b *Backend) agentStartProcess(ctx context.Context, info backends.Session, l *agentLink, spec backends.ProcessSpec) (backends.Process, error) {
	conn, env, _, err := l.get(ctx)
	if err != nil {
		return nil, err
	}
	cwd, pidFile := execproc.Paths(info, spec.Cwd, "proc", b.pidDirOf(info.BackendSessionID))
	sio, err := newAgentIO(nil, true, nil)
	if err != nil {
		return nil, boxerr.Failure("docker backend: making the managed process's stdio: %v", err).Wrap(err)
	}
	argv := append([]string{"sh", "-c", procScript, "boxrt-proc", cwd, pidFile, spec.Command}, spec.Args...)
	proc, err := conn.Spawn(ctx, sandboxagent.SpawnRequest{
		Argv: argv, Env: mergeEnv(env, spec.Env), Dir: "/",
		Stdin: sio.childIn, Stdout: sio.childOut, Stderr: sio.childErr,
	})
	sio.closeChildEnds()
	if err != nil {
		sio.close()
		return nil, b.spawnError(ctx, l, conn, err)
	}
	stdin := &agentStdin{f: sio.stdinW}
	ep, outW, errW := execproc.New(stdin)
	p := &agentProcess{Proc: ep, proc: proc, pidFile: pidFile, env: env}
	go p.run(l, conn, sio, outW, errW)
	return p, nil
}

type agentProcess struct {
	*execproc.Proc
	proc    *sandboxagent.Proc
	pidFile string
	env     []string
}

// Signal delivers sig to the managed process's group; signalling a process
// that has already exited is a no-op.
func (p *agentProcess) Signal(sig syscall.Signal) error {
	if _, ok := signalNames[sig]; !ok {
		return boxerr.Validation("signal", "unsupported signal %d", int(sig))
	}
	if p.Exited() {
		return nil
	}
	if err := p.proc.Signal(sig); err != nil {
		return boxerr.Failure("signalling a managed process: %v", err).Wrap(err)
	}
	return nil
}

// run copies the output until the process ended, sweeps what it left in
// its group and records its outcome; a killed process reads as -signal.
// Output that can no longer be delivered ends the process.
func (p *agentProcess) run(l *agentLink, conn *sandboxagent.Conn, sio *agentIO, outW, errW *io.PipeWriter) {
	r := watchRun(p.proc, sio, backends.ExecRequest{Stdout: outW, Stderr: errW})
	select {
	case <-r.exited:
	case <-r.failed:
		_ = p.proc.Signal(syscall.SIGKILL)
		<-r.exited
	}
	// What it left in its group dies with it (and lets its output end).
	_ = p.proc.Signal(syscall.SIGKILL)
	<-r.ended
	r.stop()
	outW.Close()
	errW.Close()
	sio.close()
	if r.waitErr != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*agentConnectTimeout)
		defer cancel()
		p.Finish(-1, l.lost(ctx, conn))
		return
	}
	p.removePidFile(conn)
	code := r.exit.Code
	if r.exit.Signal != 0 {
		code = -r.exit.Signal
	}
	p.Finish(code, nil)
}

// removePidFile deletes the pid file of a process that ended (only a
// running one is an orphan for a later boxrt to kill).
func (p *agentProcess) removePidFile(conn *sandboxagent.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	rm, err := conn.Spawn(ctx, sandboxagent.SpawnRequest{Argv: []string{"rm", "-f", p.pidFile}, Env: p.env, Dir: "/"})
	if err == nil {
		_, _ = rm.Wait(ctx)
	}
}

// agentStdin is a managed process's stdin: boxrt's end of its pipe. A
// write after the process ended reads as a closed pipe.
type agentStdin struct{ f *os.File }

func (s *agentStdin) Write(b []byte) (int, error) {
	n, err := s.f.Write(b)
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
		err = io.ErrClosedPipe
	}
	return n, err
}

func (s *agentStdin) Close() error { return s.f.Close() }

// SetWriteDeadline lets the relay give up on a process that stopped
// reading its stdin.
func (s *agentStdin) SetWriteDeadline(t time.Time) error { return s.f.SetWriteDeadline(t) }
