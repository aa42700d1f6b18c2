package bwrap

import (
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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
			if left <= 0 || pidfdReady(fd, int(left.Milliseconds())+1) {
				break
			}
		}
		unix.Close(fd)
	}
}
