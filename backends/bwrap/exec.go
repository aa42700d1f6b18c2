package bwrap

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// limitsOf is the cgroup limits of a session (memoryMB overrides when > 0).
func limitsOf(info backends.Session, memoryMB int) limits {
	lim := limits{memoryMB: info.MemoryMB, pids: info.PidsLimit, cpus: info.CPUs}
	if memoryMB > 0 {
		lim.memoryMB = memoryMB
	}
	return lim
}

// Exec implements backends.Backend. Output streams into req.Stdout and
// req.Stderr as it arrives. On timeout (ExitStatus.TimedOut) or ctx
// cancellation (ctx.Err()) the whole sandbox is killed; the session's files
// are untouched.
func (b *Backend) Exec(ctx context.Context, info backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	if err := ctx.Err(); err != nil {
		return backends.ExitStatus{}, err
	}
	if strings.TrimSpace(req.Cmd) == "" {
		return backends.ExitStatus{}, boxerr.Validation("cmd", "cmd must not be empty")
	}
	if strings.ContainsRune(req.Cmd, 0) {
		return backends.ExitStatus{}, boxerr.Validation("cmd", "cmd must not contain NUL bytes")
	}
	dir, err := b.lookup(info)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	xio, err := newExecIO(req)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	defer xio.finish()
	r, ok := b.usePrestarted(ctx, dir, info, req)
	if !ok {
		if r, err = b.startExec(dir, info, req, xio); err != nil {
			return backends.ExitStatus{}, err
		}
	}
	xio.started()
	timedOut, canceled := r.await(ctx, req, xio)
	switch {
	case r.wasStopped():
		return backends.ExitStatus{}, boxerr.Failure("session %s was stopped while the command was running", info.SessionID)
	case canceled:
		return backends.ExitStatus{}, ctx.Err()
	}
	r.explainLimits(req.Stderr, info)
	if timedOut {
		return backends.ExitStatus{TimedOut: true}, nil
	}
	if r.state == nil {
		return backends.ExitStatus{}, boxerr.Failure("bwrap: %v", r.waitErr).Wrap(r.waitErr)
	}
	code := r.state.ExitCode()
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal()) // shell convention, as bwrap reports its child's
	}
	return backends.ExitStatus{ExitCode: code}, nil
}

// startExec starts req's command in a fresh sandbox of the session.
func (b *Backend) startExec(dir string, info backends.Session, req backends.ExecRequest, xio *execIO) (*run, error) {
	return b.start(launch{
		sessionID: info.SessionID,
		key:       info.BackendSessionID,
		dir:       dir,
		info:      info,
		workdir:   req.Workdir,
		env:       req.Env,
		// -l as the reference does (sh -lc): a profile in the image or in
		// /home/.profile applies.
		argv:   []string{"/bin/sh", "-lc", req.Cmd},
		lim:    limitsOf(info, 0),
		kind:   kindExec,
		stdin:  xio.stdin,
		stdout: xio.stdout,
		stderr: xio.stderr,
	})
}

// await waits for the exec's end, its timeout or ctx's cancellation,
// serving req's resizes and signals meanwhile; on timeout or cancellation
// the sandbox is killed. It returns once the run is done.
func (r *run) await(ctx context.Context, req backends.ExecRequest, xio *execIO) (timedOut, canceled bool) {
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	for waiting := true; waiting; {
		select {
		case <-r.done:
			waiting = false
		case <-timeout:
			select {
			case <-r.done: // finished in the same instant: a completion
			default:
				timedOut = true
				r.kill()
			}
			waiting = false
		case <-ctx.Done():
			canceled = true
			r.kill()
			waiting = false
		case rs := <-req.Resize:
			rs.Done <- xio.resize(rs.Size)
		case sig := <-req.Signals:
			// A signal that finds nobody to receive it (the command is
			// ending) is not the exec's failure.
			_ = r.signal(sig)
		}
	}
	<-r.done
	return timedOut, canceled
}

// explainLimits says on stderr (nil: nowhere) why a finished run's
// command may have failed, in the stream the caller (often an LLM) reads:
// a bare exit status 137 or a timeout explains nothing.
func (r *run) explainLimits(stderr io.Writer, info backends.Session) {
	if stderr == nil {
		return
	}
	if r.oomKills > 0 {
		fmt.Fprintf(stderr, "\nboxrt: the memory limit (%d MiB) killed %d process(es)\n", limitsOf(info, 0).memoryMB, r.oomKills)
	}
	if r.pidsHits > 0 {
		fmt.Fprintf(stderr, "\nboxrt: the process limit (%d) refused %d fork(s)\n", info.PidsLimit, r.pidsHits)
	}
}
