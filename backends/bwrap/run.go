package bwrap

import (
	"os"
	"os/exec"
	"sync"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// run is one started bwrap process (a session's resident sandbox) in the
// session's cgroup.
type run struct {
	b    *Backend
	key  string
	cg   *cgroup
	done chan struct{} // closed once bwrap is reaped

	mu            sync.Mutex
	cmd           *exec.Cmd // set once started
	killRequested bool
	stopped       bool // killed by StopSession

	// init is a pidfd of bwrap's namespace init (-1: unknown), which wait
	// reaps (see reapInit).
	init int
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
