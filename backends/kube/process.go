package kube

import (
	"context"
	"io"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/remotecommand"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/execproc"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// StartProcess implements backends.Backend: a managed process is an exec
// with stdin attached and no TTY, so its stdout is a clean byte stream.
//
// The process lives as long as its exec stream: if the connection to the
// API server (or the API server's to the kubelet) drops, the kubelet closes
// the process's stdin and output, the process sees EOF (an MCP server
// exits), and Wait reports the broken stream. The runtime then reports the
// process as exited and the host starts it again; nothing reconnects to
// the old one, because the exec subresource cannot re-attach to a running
// process. Callers must keep reading both Stdout and Stderr until EOF.
func (b *Backend) StartProcess(ctx context.Context, info backends.Session, spec backends.ProcessSpec) (backends.Process, error) {
	if b.configErr != nil {
		return nil, b.configErr
	}
	if strings.TrimSpace(spec.Command) == "" {
		return nil, boxerr.Validation("command", "command must not be empty")
	}
	cwd, pidFile := execproc.Paths(info, spec.Cwd, "proc", b.pidDirOf(info.BackendSessionID))
	cmd := append([]string{"sh", "-c", envPrelude + sandboxsh.ProcScript, "boxrt-proc"}, envArgs(spec.Env)...)
	cmd = append(cmd, cwd, pidFile, spec.Command)
	cmd = append(cmd, spec.Args...)
	ex, err := b.executor(info.BackendSessionID, cmd, false)
	if err != nil {
		return nil, b.apiError("preparing managed process in Pod "+info.BackendSessionID, err)
	}
	b.touch(ctx, info.BackendSessionID)
	inR, inW := io.Pipe()
	proc, outW, errW := execproc.New(inW)
	p := &process{Proc: proc, b: b, pod: info.BackendSessionID, pidFile: pidFile}
	go func() { p.Finish(p.run(ex, inR, outW, errW)) }()
	go p.keepTouching()
	return p, nil
}

type process struct {
	*execproc.Proc
	b       *Backend
	pod     string
	pidFile string
}

// Signal delivers sig to every process of the managed process's tree
// through a second exec. Signalling a process that has exited is a no-op.
func (p *process) Signal(sig syscall.Signal) error {
	name, ok := sandboxsh.SignalNames[sig]
	if !ok {
		return boxerr.Validation("signal", "unsupported signal %d", int(sig))
	}
	if p.Exited() {
		return nil
	}
	return p.b.signal(context.Background(), p.pod, p.pidFile, name, false)
}

// keepTouching refreshes the Pod's last-used annotation while the process
// runs: its relay traffic is invisible to other replicas, whose reapers
// would otherwise take the session for idle.
func (p *process) keepTouching() {
	t := time.NewTicker(touchEvery)
	defer t.Stop()
	for {
		select {
		case <-p.Done():
			return
		case <-t.C:
			p.b.touch(context.Background(), p.pod)
		}
	}
}

// run streams the process and returns its outcome for Finish.
func (p *process) run(ex remotecommand.Executor, stdin *io.PipeReader, outW, errW *io.PipeWriter) (int, error) {
	err := ex.StreamWithContext(context.Background(), remotecommand.StreamOptions{Stdin: stdin, Stdout: outW, Stderr: errW})
	code, serr := exitCode(err)
	// Readers get EOF (or the stream's error) as soon as output ends.
	outW.CloseWithError(serr)
	errW.CloseWithError(serr)
	// A later Stdin write fails instead of blocking forever, and the
	// stream's stdin copier (which may outlive the stream) ends.
	stdin.CloseWithError(io.ErrClosedPipe)
	// Whatever the process left running in its session dies with it, and
	// its pid file goes; after a broken stream this also stops a process
	// nobody can reach any more.
	_ = p.b.signal(context.Background(), p.pod, p.pidFile, "KILL", true)
	if serr != nil {
		return -1, p.b.apiError("managed process stream in Pod "+p.pod, serr)
	}
	return sandboxsh.SignalExitCode(code), nil
}
