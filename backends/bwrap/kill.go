package bwrap

import (
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/boxerr"
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
// With a cgroup of its own, cgroup.kill (v2) comes first and a sweep (v1)
// last; a session cgroup holds other execs too and is never swept for one.
// kill returns once init is gone, and with it every process of the
// namespace (the kernel reaps them all before init's exit completes), so
// nothing of a killed exec still counts against the session's limits.
func (r *run) kill() {
	r.mu.Lock()
	r.killRequested = true
	cmd := r.cmd
	r.mu.Unlock()
	if cmd == nil {
		return // start kills it as soon as it exists
	}
	if r.own && r.cg != nil && r.cg.m.v2Kill {
		r.cg.killAll()
	}
	inits := killInit(cmd.Process)
	_ = cmd.Process.Kill() // os.Process signals through a pidfd: never a recycled pid
	if r.own {
		r.cg.killAll()
	}
	awaitExit(inits, 10*time.Second)
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
	for deadline := time.Now().Add(250 * time.Millisecond); time.Now().Before(deadline); {
		if st := procState(p.Pid); st == 0 || strings.ContainsRune("TtZX", st) {
			break
		}
		time.Sleep(time.Millisecond)
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
			if left <= 0 {
				break
			}
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
			if err != unix.EINTR && (err != nil || n > 0) {
				break
			}
		}
		unix.Close(fd)
	}
}

// signal delivers a non-SIGKILL signal to every process inside the sandbox
// but not to bwrap (which would die on most signals and, through
// --die-with-parent, turn a polite SIGTERM into a SIGKILL of the tree) nor
// to the namespace's init (the kernel drops signals to a pid-namespace init
// that has no handler). When the command exits, init exits and the
// namespace goes.
func (r *run) signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		r.kill()
		return nil
	}
	r.mu.Lock()
	cmd := r.cmd
	if cmd != nil {
		r.lastSignal = sig
	}
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	outer := cmd.Process.Pid
	// Right after start the command may not exist yet (bwrap still builds
	// the sandbox): wait for it rather than lose the signal.
	for deadline := time.Now().Add(2 * time.Second); ; {
		var pids []int
		if r.own && r.cg != nil {
			pids = r.cg.pids()
		} else {
			pids = descendants(outer)
		}
		// Checked after listing: while bwrap is alive (or an unreaped
		// zombie) its descendants' pids cannot have been recycled.
		if cmd.Process.Signal(syscall.Signal(0)) != nil {
			return nil // already gone
		}
		pids = slices.DeleteFunc(pids, func(p int) bool { return p == outer || ppidOf(p) == outer })
		if len(pids) > 0 {
			for _, pid := range pids {
				_ = syscall.Kill(pid, sig)
			}
			return nil
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The command never appeared (bwrap stuck in setup). A terminating
	// signal still ends the process as asked: init is killed first (see
	// kill) so nothing is orphaned, then bwrap gets the signal itself and
	// Wait reports it. Other signals have no receiver yet and are dropped.
	switch sig {
	case syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT:
		awaitExit(killInit(cmd.Process), 0)
		err := cmd.Process.Signal(sig)
		_ = cmd.Process.Signal(syscall.SIGCONT) // the pending signal acts on resume
		if err != nil && !errors.Is(err, os.ErrProcessDone) {
			return boxerr.Failure("bwrap: signal %v: %v", sig, err).Wrap(err)
		}
	}
	return nil
}
