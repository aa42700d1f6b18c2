package bwrap

import (
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// run is one started bwrap process and its cgroup.
type run struct {
	b    *Backend
	key  string
	leaf string
	cg   *cgroup
	// own: cg is this run's alone (a managed process's) and goes with it;
	// otherwise it is the session's, shared with the session's other execs,
	// and never swept or removed for one run.
	own  bool
	done chan struct{} // closed once bwrap is reaped and an own cgroup removed

	mu            sync.Mutex
	cmd           *exec.Cmd // set once started
	killRequested bool
	stopped       bool // killed by StopSession
	lastSignal    syscall.Signal

	// The session cgroup's counters when the run started (shared cg),
	// guarded by mu (see restartCounters).
	oomBefore, pidsBefore int64
	// init is a pidfd of bwrap's namespace init (-1: unknown), which wait
	// reaps (see reapInit).
	init int

	// Written before done is closed, read after.
	state    *os.ProcessState
	waitErr  error
	oomKills int64
	pidsHits int64
}

// register adds r to its session, refusing when the session is being
// stopped or its directory is gone. StopSession removes the directory while
// still marked stopping, so a run either is refused here or is seen (and
// killed) by StopSession.
func (b *Backend) register(r *run, sessionID, dir string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	sr := b.sessions[r.key]
	if sr != nil && sr.stopping > 0 {
		return boxerr.SessionNotFound(sessionID)
	}
	if _, err := os.Stat(dir); err != nil {
		return boxerr.SessionNotFound(sessionID)
	}
	if sr == nil {
		sr = &sessionRuns{runs: map[*run]struct{}{}}
		b.sessions[r.key] = sr
	}
	sr.runs[r] = struct{}{}
	return nil
}

func (b *Backend) unregister(r *run) {
	b.mu.Lock()
	defer b.mu.Unlock()
	sr := b.sessions[r.key]
	if sr == nil {
		return
	}
	delete(sr.runs, r)
	if len(sr.runs) == 0 && sr.stopping == 0 {
		delete(b.sessions, r.key)
	}
}

// restartCounters makes the session cgroup's counters count from now: a
// prestarted sandbox's run starts with its command, not with its spawn.
func (r *run) restartCounters() {
	if r.own {
		return
	}
	oom, pids := r.cg.oomKills(), r.cg.pidsLimitHits()
	r.mu.Lock()
	r.oomBefore, r.pidsBefore = oom, pids
	r.mu.Unlock()
}

func (r *run) markStopped() {
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
}

func (r *run) wasStopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}
