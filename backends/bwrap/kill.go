package bwrap

import (
	"context"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
)

// kill SIGKILLs the whole sandbox.
//
// The pid namespace is what makes this reliable: when its init dies, the
// kernel kills every process in it, fork bombs included, without racing
// their forks. Normally bwrap's death reaches init through --die-with-parent,
// but a bwrap killed right after cloning init, before init armed that,
// would orphan a live sandbox. So bwrap is first stopped (it can no longer
// clone), its init child — if any — is SIGKILLed directly (a signal from an
// ancestor namespace that init cannot ignore), and only then bwrap dies.
// kill returns once init is gone, and with it every process of the
// namespace (the kernel reaps them all before init's exit completes), so
// nothing of the sandbox still counts against the session's limits.
func (r *run) kill() {
	r.mu.Lock()
	r.killRequested = true
	cmd := r.cmd
	r.mu.Unlock()
	if cmd == nil {
		return // start kills it as soon as it exists
	}
	inits := killInit(cmd.Process)
	_ = cmd.Process.Kill() // os.Process signals through a pidfd: never a recycled pid
	awaitExit(inits, 10*time.Second)
}

var _ backends.SandboxKiller = (*Backend)(nil)

// KillSandboxes implements backends.SandboxKiller: every process in the
// sessions' cgroups — bwrap, its namespace init, what runs inside — is
// SIGKILLed in one pass, so the kernel tears the sandboxes down together;
// a bwrap killed while cloning its init leaves that init in the cgroup,
// where StopSession's removal of the leaf kills it. The runs are marked
// stopped first: a call racing the kill reports the session gone rather
// than starting its sandbox again. A session without a cgroup is left to
// StopSession's kill.
func (b *Backend) KillSandboxes(_ context.Context, infos []backends.Session) {
	for _, info := range infos {
		if _, ok := b.sessionDir(info); !ok {
			continue
		}
		key := info.BackendSessionID
		b.mu.Lock()
		sf := b.open[key]
		rec, unadopted := b.adoptable[key]
		var runs []*run
		if sr := b.sessions[key]; sr != nil {
			for r := range sr.runs {
				runs = append(runs, r)
			}
		}
		b.mu.Unlock()
		for _, r := range runs {
			r.markStopped()
		}
		if sf != nil {
			sf.mu.Lock()
			sf.cg.sigkill()
			sf.mu.Unlock()
		}
		if unadopted && rec.alive() {
			// An earlier boxrt's sandbox, not yet used by this one.
			b.recordCgroup(rec).sigkill()
		}
	}
}

// killInit stops bwrap and SIGKILLs the children it has (its namespace
// init), returning pidfds of them for awaitExit. It is a no-op once bwrap
// is reaped.
func killInit(p *os.Process) (pidfds []int) {
	if p.Signal(syscall.SIGSTOP) != nil {
		return nil
	}
	// SIGSTOP takes effect when bwrap next leaves the kernel: wait for it
	// (a clone in progress completes first, and its child is then listed).
	st := procState(p.Pid)
	for deadline := time.Now().Add(250 * time.Millisecond); st != 0 && !strings.ContainsRune("TtZX", st) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		st = procState(p.Pid)
	}
	if st == 0 || st == 'Z' || st == 'X' {
		// Dead (killed with its cgroup, say): its children, if any, were
		// handed to the subreaper already and are no longer bwrap's.
		return nil
	}
	kids := children(p.Pid)
	// Checked after listing: while bwrap is not reaped, pids of its children
	// cannot have been recycled into strangers.
	if p.Signal(syscall.Signal(0)) != nil {
		return nil
	}
	for _, k := range kids {
		fd, err := unix.PidfdOpen(k, 0)
		if err != nil {
			_ = syscall.Kill(k, syscall.SIGKILL)
			continue
		}
		_ = unix.PidfdSendSignal(fd, syscall.SIGKILL, nil, 0)
		pidfds = append(pidfds, fd)
	}
	return pidfds
}

// awaitExit waits (up to timeout in all) until the processes behind the
// pidfds have exited, and closes the pidfds.
func awaitExit(pidfds []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, fd := range pidfds {
		for {
			left := time.Until(deadline)
			if left <= 0 || pidfdReady(fd, int(left.Milliseconds())+1) {
				break
			}
		}
		unix.Close(fd)
	}
}
