package bwrap

import (
	"cmp"
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// StartProcess implements backends.Backend: a managed process started by
// the agent in the session's resident sandbox (resident.go), with real
// pipes. It shares the session's mounts, network, loopback, pid namespace
// and cgroup: spec.MemoryMB cannot bound it apart from the session's other
// processes and is not applied.
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
	lay, err := b.commandLayout(dir, info, strings.TrimSpace(spec.Cwd), spec.Env)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func(childReads bool) (ours, child *os.File, err error) {
		ours, child, err = childPipe(childReads)
		if err == nil {
			files = append(files, ours, child)
		}
		return ours, child, err
	}
	inW, inR, err1 := pipe(true)
	outR, outW, err2 := pipe(false)
	errR, errW, err3 := pipe(false)
	if err := cmp.Or(err1, err2, err3); err != nil {
		closeAll()
		return nil, err
	}
	// exec "$0" "$@": the shell resolves the command on PATH (and reads a
	// profile, like the reference's sh -lc) and then becomes it, so signals
	// reach the server itself.
	argv := append([]string{"/bin/sh", "-lc", `exec "$0" "$@"`, spec.Command}, spec.Args...)
	m, p, err := b.spawn(ctx, dir, info, func(*machine) (sandboxagent.SpawnRequest, error) {
		return sandboxagent.SpawnRequest{
			Argv: argv, Env: sandboxEnv(lay.env), Dir: lay.workdir, Stdin: inR, Stdout: outW, Stderr: errW,
		}, nil
	})
	// The child holds its ends now; ours would keep EOF from ever coming.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		closeAll()
		return nil, err
	}
	touch(dir)
	return &process{m: m, p: p, stdin: inW, stdout: &eofCloser{f: outR}, stderr: &eofCloser{f: errR}}, nil
}

// process is a managed process (backends.Process).
type process struct {
	m      *machine
	p      *sandboxagent.Proc
	stdin  *os.File
	stdout io.Reader
	stderr io.Reader

	once sync.Once
	exit sandboxagent.Exit
}

func (p *process) Stdin() io.WriteCloser { return p.stdin }
func (p *process) Stdout() io.Reader     { return p.stdout }
func (p *process) Stderr() io.Reader     { return p.stderr }

// Wait returns the exit code, or the negative signal number when the
// process was killed by a signal (a sandbox lost meanwhile reads as
// SIGKILL).
func (p *process) Wait() (int, error) {
	p.once.Do(func() { p.exit = exitOf(p.p) })
	if p.exit.Signal != 0 {
		return -p.exit.Signal, nil
	}
	return p.exit.Code, nil
}

// Signal sends sig to the process's group (what it started, unless that
// left the group); SIGKILL ends the whole sandbox when the group does not
// die within killGrace.
func (p *process) Signal(sig syscall.Signal) error {
	if sig != syscall.SIGKILL {
		return p.p.Signal(sig)
	}
	p.m.end(p.p)
	return nil
}

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
