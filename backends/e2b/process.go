package e2b

import (
	"context"
	"io"
	"sync"
	"syscall"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/e2bapi/envd/process"
)

// StartProcess implements backends.Backend: the managed process is a
// background command of envd (its argv as given, no shell), its output
// delivered through pipes while its stream lasts. memory_mb is not
// enforced: E2B has no per-process limit.
func (b *Backend) StartProcess(ctx context.Context, info backends.Session, spec backends.ProcessSpec) (backends.Process, error) {
	if spec.Command == "" {
		return nil, boxerr.Validation("command", "command must not be empty")
	}
	sb, err := b.envd(ctx, info)
	if err != nil {
		return nil, err
	}
	cfg := &process.ProcessConfig{Cmd: spec.Command, Args: spec.Args, Envs: spec.Env}
	if spec.Cwd != "" {
		cfg.Cwd = &spec.Cwd
	}
	stdin := true
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	c, err := b.start(ctx, sb, &process.StartRequest{Process: cfg, Stdin: &stdin}, outputs{stdout: outW, stderr: errW}, 0)
	if err != nil {
		return nil, err
	}
	go func() {
		<-c.done
		_ = outW.Close()
		_ = errW.Close()
	}()
	p := &managed{c: c, stdout: outR, stderr: errR}
	p.stdin = &stdinWriter{c: c}
	return p, nil
}

// managed is a managed process on envd.
type managed struct {
	c              *command
	stdin          *stdinWriter
	stdout, stderr *io.PipeReader
}

func (p *managed) Stdin() io.WriteCloser { return p.stdin }
func (p *managed) Stdout() io.Reader     { return p.stdout }
func (p *managed) Stderr() io.Reader     { return p.stderr }

// Wait implements backends.Process: the exit code, or minus the signal
// that killed it.
func (p *managed) Wait() (int, error) {
	<-p.c.done
	code, sig, err := p.c.exit()
	if sig != 0 {
		return -sig, err
	}
	return code, err
}

// Signal implements backends.Process (envd: SIGKILL or SIGTERM).
func (p *managed) Signal(sig syscall.Signal) error {
	select {
	case <-p.c.done:
		return nil
	default:
	}
	return p.c.signal(context.Background(), sig)
}

// stdinWriter writes a managed process's stdin through envd.
type stdinWriter struct {
	c      *command
	mu     sync.Mutex
	closed bool
}

func (w *stdinWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, io.ErrClosedPipe
	}
	if err := w.c.input(context.Background(), p, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *stdinWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	select {
	case <-w.c.done:
		return nil
	default:
	}
	return w.c.closeStdin(context.Background())
}
