package bwrap

import (
	"context"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/sandboxsh"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// limitsOf is the cgroup limits of a session (memoryMB overrides when > 0).
func limitsOf(info backends.Session, memoryMB int) limits {
	lim := limits{memoryMB: info.MemoryMB, pids: info.PidsLimit, cpus: info.CPUs}
	if memoryMB > 0 {
		lim.memoryMB = memoryMB
	}
	return lim
}

// Exec implements backends.Backend: the command runs as /bin/sh -lc (-c
// for NoLogin) in
// the session's resident sandbox (resident.go), started by its agent in a
// process group of its own, with pipes or a pseudo-terminal boxrt made.
// Output streams into req.Stdout and req.Stderr as it arrives. On timeout
// (ExitStatus.TimedOut) or ctx cancellation (ctx.Err()) the command's
// process group is killed — and the whole sandbox when that does not end
// it (ExitStatus.Restarted); the session's files are untouched. What the
// command leaves running when it ends on its own stays, live exec or
// plain: it is the session's.
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
	lay, err := b.commandLayout(dir, info, req.Workdir, req.Env)
	if err != nil {
		return backends.ExitStatus{}, err
	}
	var xio *execIO
	defer func() {
		if xio != nil {
			xio.finish()
		}
	}()
	// Its streams are made for the sandbox that runs it: a terminal lives
	// in that sandbox's devpts.
	m, p, err := b.spawn(ctx, dir, info, func(m *machine) (sandboxagent.SpawnRequest, error) {
		if xio != nil {
			xio.finish()
		}
		if xio, err = newExecIO(req, m.openPTY); err != nil {
			return sandboxagent.SpawnRequest{}, err
		}
		// -l as the reference does (sh -lc): a profile in the image or in
		// /home/.profile applies.
		return xio.spawnRequest([]string{"/bin/sh", sandboxsh.ShellFlags(req.NoLogin), req.Cmd}, lay), nil
	})
	if xio != nil {
		xio.started()
	}
	if err != nil {
		return backends.ExitStatus{}, err
	}
	touch(dir)
	oom, pids := m.r.cg.oomKills(), m.r.cg.pidsLimitHits()
	exit, timedOut, canceled, hostKilled := m.awaitExec(ctx, p, req, xio)
	xio.ended()
	switch {
	case m.r.wasStopped():
		return backends.ExitStatus{}, boxerr.Failure("session %s was stopped while the command was running", info.SessionID)
	case canceled:
		return backends.ExitStatus{}, ctx.Err()
	}
	ooms := m.r.cg.oomKills() - oom
	explainLimits(req.Stderr, info, ooms, m.r.cg.pidsLimitHits()-pids)
	restarted := m.restarted || hostKilled || !m.alive()
	if timedOut {
		return backends.ExitStatus{TimedOut: true, Restarted: restarted, OOMKilled: ooms > 0}, nil
	}
	return backends.ExitStatus{ExitCode: exit.Code, Restarted: restarted, OOMKilled: ooms > 0}, nil
}

// commandLayout is the session's layout for one command: its working
// directory (made, as the sandbox user, when it lies in a writable mount:
// prepareMounts) and its environment (checked).
func (b *Backend) commandLayout(dir string, info backends.Session, workdir string, env map[string]string) (layout, error) {
	lay, err := b.layoutFor(b.files(info.BackendSessionID), dir, info, workdir, env)
	if err != nil {
		return layout{}, err
	}
	if err := prepareMounts(lay, b.id); err != nil {
		return layout{}, err
	}
	return lay, nil
}

// awaitExec waits for the exec's end, its timeout or ctx's cancellation,
// serving req's resizes and signals meanwhile; on timeout or cancellation
// the command is killed (machine.end).
func (m *machine) awaitExec(ctx context.Context, p *sandboxagent.Proc, req backends.ExecRequest, xio *execIO) (exit sandboxagent.Exit, timedOut, canceled, hostKilled bool) {
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	signalled := false
	for {
		select {
		case <-p.Done():
			if signalled {
				// Signals come from box_exec_kill: a gentler signal is
				// still a kill, so what the tree kept (a child that
				// ignored it) goes when the command has ended.
				_ = p.Signal(syscall.SIGKILL)
			}
			return exitOf(p), false, false, false
		case <-timeout:
			select {
			case <-p.Done(): // finished in the same instant: a completion
				return exitOf(p), false, false, false
			default:
			}
			exit, hostKilled = m.end(p)
			return exit, true, false, hostKilled
		case <-ctx.Done():
			exit, hostKilled = m.end(p)
			return exit, false, true, hostKilled
		case rs := <-req.Resize:
			rs.Done <- xio.resize(rs.Size)
		case sig := <-req.Signals:
			if sig == syscall.SIGKILL {
				exit, hostKilled = m.end(p)
				return exit, false, false, hostKilled
			}
			// A signal that finds nobody to receive it (the command is
			// ending) is not the exec's failure.
			signalled = true
			_ = p.Signal(sig)
		}
	}
}

// explainLimits says on stderr (nil: nowhere) why a finished command may
// have failed, in the stream the caller (often an LLM) reads: a bare exit
// status 137 or a timeout explains nothing. The counts are the session
// cgroup's changes while the command ran: another command of the session
// running at the same time is counted too.
func explainLimits(stderr io.Writer, info backends.Session, oomKills, pidsHits int64) {
	if stderr == nil {
		return
	}
	if oomKills > 0 {
		fmt.Fprintf(stderr, "\nboxrt: the memory limit (%d MiB) killed %d process(es)\n", limitsOf(info, 0).memoryMB, oomKills)
	}
	if pidsHits > 0 {
		fmt.Fprintf(stderr, "\nboxrt: the process limit (%d) refused %d fork(s)\n", info.PidsLimit, pidsHits)
	}
}
