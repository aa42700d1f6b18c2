package bwrap

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/internal/boxerr"
)

var _ backends.ExecPrestarter = (*Backend)(nil)

// prestartScript runs in a prestarted sandbox: the command arrives as $1.
const prestartScript = sandboxsh.PrestartHead + `exec /bin/sh -lc "$1"`

// prestarted is a sandbox spawned ahead of its command: bwrap with the
// session's mounts, limits and cgroup, running a shell that waits for the
// command on line (see sandboxsh.PrestartHead). Its output goes to
// writers set when the command is handed over.
type prestarted struct {
	r       *run
	workdir string
	line    *os.File // our end of the sandbox's stdin
	stdout  *handover
	stderr  *handover
}

// End closes the sandbox's stdin: the shell, reading EOF before a line,
// exits and bwrap with it (run.wait reaps it).
func (p *prestarted) End() { p.line.Close() }

// PrestartExec implements backends.ExecPrestarter: the session's next
// plain exec without environment, in its mount path, runs in a sandbox
// spawned now.
func (b *Backend) PrestartExec(_ context.Context, info backends.Session) error {
	dir, err := b.lookup(info)
	if err != nil {
		return err
	}
	workdir := filepath.Clean(info.MountPathOrDefault())
	in, line, err := os.Pipe()
	if err != nil {
		return boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
	}
	p := &prestarted{workdir: workdir, line: line, stdout: &handover{}, stderr: &handover{}}
	p.r, err = b.start(launch{
		sessionID: info.SessionID,
		key:       info.BackendSessionID,
		dir:       dir,
		info:      info,
		workdir:   workdir,
		argv:      []string{"/bin/sh", "-c", prestartScript, "boxrt-exec"},
		lim:       limitsOf(info, 0),
		kind:      kindExec,
		stdin:     in,
		stdout:    p.stdout,
		stderr:    p.stderr,
	})
	in.Close() // the sandbox holds its own
	if err != nil {
		line.Close()
		return err
	}
	b.prestarts.Put(info.BackendSessionID, p)
	return nil
}

// usePrestarted hands req's command to the session's prestarted sandbox
// and returns its run; ok is false when there is none that can serve req
// (which then spawns its own), and one that cannot is ended: it is only for
// a plain exec without environment in the session's mount path.
func (b *Backend) usePrestarted(ctx context.Context, dir string, info backends.Session, req backends.ExecRequest) (_ *run, ok bool) {
	p, ok := b.prestarts.Take(ctx, info.BackendSessionID)
	if !ok {
		return nil, false
	}
	workdir := req.Workdir
	if workdir == "" {
		workdir = p.workdir
	}
	line, fits := sandboxsh.PrestartLine(req.Cmd)
	ended := false
	select {
	case <-p.r.done: // killed by a stop, or its shell died
		ended = true
	default:
	}
	if !req.Plain() || !fits || filepath.Clean(workdir) != p.workdir || ended {
		p.End()
		return nil, false
	}
	p.stdout.set(orDiscard(req.Stdout))
	p.stderr.set(orDiscard(req.Stderr))
	p.r.restartCounters()
	// At most 16 KiB into an empty pipe: never blocks. A shell that died
	// meanwhile makes it fail (EPIPE) before anything ran.
	_, err := p.line.Write(line)
	p.End() // the command's stdin: EOF, as /dev/null gives
	if err != nil {
		return nil, false
	}
	touch(dir)
	return p.r, true
}

// handover is an output destination chosen after the sandbox started;
// before that the shell writes nothing, and anything would be discarded.
type handover struct {
	mu sync.Mutex
	w  io.Writer
}

func (h *handover) set(w io.Writer) {
	h.mu.Lock()
	h.w = w
	h.mu.Unlock()
}

func (h *handover) Write(p []byte) (int, error) {
	h.mu.Lock()
	w := h.w
	h.mu.Unlock()
	if w == nil {
		return len(p), nil
	}
	return w.Write(p)
}
