package bwrap

import (
	"sync"
	"time"
)

// An idle session's resident sandbox (bwrap, its init and the agent: a few
// MiB of the host's memory; with network also its egress attachment) is
// released after Config.IdleRelease with no call and no user process
// running in it: the sandbox stops, the session's files, stage, network
// namespace and cgroup stay, and the next call starts a sandbox again.
// Nothing is lost, so that call does not report Restarted. A sandbox is
// busy while its cgroup holds any process besides bwrap, its init and the
// agent: a command still running, a background job it left, a managed
// process or a terminal. Without cgroups boxrt cannot tell, and never
// releases. A warm pool's sandbox, kept for a fast first call, is not
// released before a session claims it.

// idleScan bounds how often the sandboxes are looked at.
const (
	minIdleScan = 100 * time.Millisecond
	maxIdleScan = 5 * time.Second
)

// idleLoop releases idle sandboxes until stop is closed.
func (b *Backend) idleLoop(stop <-chan struct{}) {
	defer close(b.idleDone)
	t := time.NewTicker(min(max(b.cfg.IdleRelease/4, minIdleScan), maxIdleScan))
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		b.releaseIdle()
	}
}

// idleReleases bounds the sandboxes released at once: a release is mostly
// waiting for the sandbox's processes to die, and one at a time a
// thousand sandboxes that went idle together took longer to go than
// they had been idle.
const idleReleases = 16

// releaseIdle looks at every running sandbox and releases the idle ones,
// several at a time.
func (b *Backend) releaseIdle() {
	slots := make(chan struct{}, idleReleases)
	var wg sync.WaitGroup
	for _, sf := range b.openSessions() {
		if !sf.res.running() {
			continue
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			sf.releaseIdle(b.cfg.IdleRelease)
		}()
	}
	wg.Wait()
}

// running reports whether the session has a sandbox.
func (res *resident) running() bool {
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.conn != nil
}

// startIdleLoop starts idleLoop once, when a sandbox first starts and
// Config.IdleRelease asks for it; Close stops it.
func (b *Backend) startIdleLoop() {
	if b.cfg.IdleRelease <= 0 || b.cg.version == cgroupNone {
		return
	}
	b.idleOnce.Do(func() {
		b.idleStop, b.idleDone = make(chan struct{}), make(chan struct{})
		go b.idleLoop(b.idleStop)
	})
}

// stopIdleLoop stops idleLoop and waits for it (Close).
func (b *Backend) stopIdleLoop() {
	b.idleOnce.Do(func() {}) // none starts after this
	if b.idleStop != nil {
		close(b.idleStop)
		<-b.idleDone
	}
}

// releaseIdle stops the session's sandbox, and detaches a session's
// network (attached again with the next sandbox), when it has been idle
// for at least idle.
func (sf *sessionFiles) releaseIdle(idle time.Duration) {
	res := &sf.res
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.conn == nil || res.pooled || res.entering > 0 {
		return
	}
	m := &machine{r: res.r, conn: res.conn}
	if !m.alive() {
		return // the next call replaces it, saying so
	}
	if m.userProcesses() {
		res.busyAt = time.Now()
	}
	if time.Since(res.busyAt) < idle {
		return
	}
	m.hostKill()
	<-m.r.done
	if m.r.cg != nil {
		m.r.cg.files.close()
	}
	res.r, res.conn = nil, nil
	res.dropListener()
	// Under res.mu: no sandbox starts on the old attachment meanwhile.
	sf.detachNet()
}

// userProcesses reports whether the sandbox's cgroup holds a process other
// than bwrap (outside the sandbox's pid namespace), its init (pid 1 in it)
// and the agent (the process that connected); true when it cannot tell.
func (m *machine) userProcesses() bool {
	cg := m.r.cg
	if cg == nil {
		return true
	}
	agent := m.conn.PeerPID()
	for _, pid := range cg.pids() {
		if pid != agent && nsPidOf(pid) > 1 {
			return true
		}
	}
	return false
}
