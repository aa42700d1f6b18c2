package bwrap

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// StartProcess implements backends.Backend: a managed process in a fresh
// sandbox of the session (with the session's mounts, network and limits;
// spec.MemoryMB > 0 overrides the memory limit), with real pipes.
func (b *Backend) StartProcess(ctx context.Context, info backends.Session, spec backends.ProcessSpec) (backends.Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(spec.Command) == "" {
		return nil, boxerr.Validation("command", "command must not be empty")
	}
	for i, a := range append([]string{spec.Command}, spec.Args...) {
		if strings.ContainsRune(a, 0) {
			return nil, boxerr.Validation("args", "argument %d contains a NUL byte", i)
		}
	}
	if spec.MemoryMB != 0 && spec.MemoryMB < backends.MinMemoryMB {
		return nil, boxerr.Validation("memory_mb", "memory_mb must be 0 or at least %d, got %d", backends.MinMemoryMB, spec.MemoryMB)
	}
	dir, err := b.lookup(info)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		rd, wr, err := os.Pipe()
		if err == nil {
			files = append(files, rd, wr)
		}
		return rd, wr, err
	}
	inR, inW, err1 := pipe()
	outR, outW, err2 := pipe()
	errR, errW, err3 := pipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		closeAll()
		return nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
	}
	// exec "$0" "$@": the shell resolves the command on PATH (and reads a
	// profile, like the reference's sh -lc) and then becomes it, so signals
	// reach the server itself.
	argv := append([]string{"/bin/sh", "-lc", `exec "$0" "$@"`, spec.Command}, spec.Args...)
	r, err := b.start(launch{
		sessionID: info.SessionID,
		key:       info.BackendSessionID,
		dir:       dir,
		info:      info,
		workdir:   strings.TrimSpace(spec.Cwd),
		env:       spec.Env,
		argv:      argv,
		lim:       limitsOf(info, spec.MemoryMB),
		kind:      kindProcess,
		stdin:     inR,
		stdout:    outW,
		stderr:    errW,
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	// The child holds its ends now; ours would keep EOF from ever coming.
	inR.Close()
	outW.Close()
	errW.Close()
	return &process{r: r, stdin: inW, stdout: &eofCloser{f: outR}, stderr: &eofCloser{f: errR}}, nil
}

// process is a managed process (backends.Process).
type process struct {
	r      *run
	stdin  *os.File
	stdout io.Reader
	stderr io.Reader
}

func (p *process) Stdin() io.WriteCloser { return p.stdin }
func (p *process) Stdout() io.Reader     { return p.stdout }
func (p *process) Stderr() io.Reader     { return p.stderr }

// Wait returns the exit code: the command's status as bwrap relays it, or
// the negative signal number when the process was killed by a signal —
// either bwrap itself (SIGKILL through Signal or StopSession) or the
// command by a signal sent with Signal (bwrap reports that as 128+n).
func (p *process) Wait() (int, error) {
	r := p.r
	<-r.done
	if r.state == nil {
		return -1, boxerr.Failure("bwrap: %v", r.waitErr).Wrap(r.waitErr)
	}
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal()), nil
	}
	code := r.state.ExitCode()
	r.mu.Lock()
	last := r.lastSignal
	r.mu.Unlock()
	if last != 0 && code == 128+int(last) {
		return -int(last), nil
	}
	return code, nil
}

// Signal sends sig to the whole process tree (SIGKILL: the whole sandbox).
func (p *process) Signal(sig syscall.Signal) error { return p.r.signal(sig) }

// eofCloser closes its pipe once it has been read to the end, so a
// consumer that drains the stream does not leak the descriptor (Process
// hands out readers, not ReadClosers). Wait does not close it: output
// still buffered in the pipe stays readable after the process exits.
type eofCloser struct {
	f   *os.File
	mu  sync.Mutex
	err error
}

func (e *eofCloser) Read(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.f.Read(p)
	if err != nil {
		e.err = err
		e.f.Close()
	}
	return n, err
}
