package bwrap

import (
	"encoding/json"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// wait reaps bwrap, then unregisters the run. Once bwrap is gone its pid
// namespace is too: its init died through --die-with-parent (or with the
// agent), and a pid namespace dies with its init. Init outlives bwrap
// briefly (tearing down the namespaces takes a few milliseconds): it is
// reaped right after.
func (r *run) wait() {
	if fd, err := unix.PidfdOpen(r.cmd.Process.Pid, 0); err == nil { // not reaped yet: still ours
		awaitPidfd(fd)
	}
	_ = r.cmd.Wait()
	r.b.unregister(r)
	close(r.done)
	reapInit(r.init)
}

// awaitPidfd returns once the process behind pidfd has exited, and closes
// pidfd. It waits in the Go runtime's poller, not in a system call: a
// resident sandbox lives as long as its session, and a goroutine blocked
// in wait(2) or poll(2) holds an OS thread all that time — about 48 KiB of
// boxrt's memory per running session (the thread's two stacks), and one
// more task for the kernel to walk whenever a sandbox starts (pivot_root
// visits every task on the host). A pidfd the poller does not take is
// waited for in poll(2).
func awaitPidfd(pidfd int) {
	_ = unix.SetNonblock(pidfd, true) // what makes os.NewFile put it in the poller
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool { return pidfdReady(int(fd), 0) })
	}
	if err != nil {
		fd := int(f.Fd())
		for !pidfdReady(fd, -1) {
		}
	}
}

// pidfdReady polls pidfd for up to timeout milliseconds (-1: no limit):
// true once its process has exited (or the pidfd is unusable), false on
// the timeout or a signal.
func pidfdReady(pidfd, timeout int) bool {
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, timeout)
	return err != unix.EINTR && (err != nil || n > 0)
}

// bwrap's outer process exits as soon as its namespace init reports the
// command's status, before init itself is gone; init, orphaned, is then
// reaped by whoever adopts it — on cgroup v1 still counted against the
// session's pids limit until then, which on a busy host (or one whose pid 1
// reaps lazily) lasts long enough for a quick series of execs to exhaust
// the limit. So boxrt is a child subreaper (New): orphaned inits come to it,
// and each run reaps its own through a pidfd. bwrap reports init's pid on
// --info-fd.

// withInfoFd adds --info-fd to bwrap's options when boxrt is a subreaper,
// returning the pipe bwrap writes the info to.
func (b *Backend) withInfoFd(args []string, fds *fdList) (_ []string, r, w *os.File, err error) {
	if !b.subreaper {
		return args, nil, nil, nil
	}
	if r, w, err = os.Pipe(); err != nil {
		return nil, nil, nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
	}
	return append(args, "--info-fd", fds.add(w, false)), r, w, nil
}

// initPidfd reads bwrap's info (until bwrap closes it, right after cloning
// init) and returns a pidfd of init, or -1. The pid is trusted only while
// it is a child of bwrap (not yet reaped by us, so its pid is not
// recycled) or already an orphan of ours, which only reapInit reaps.
func initPidfd(info *os.File, bwrapPid int) int {
	_ = info.SetReadDeadline(time.Now().Add(10 * time.Second))
	data, err := io.ReadAll(info)
	if err != nil {
		return -1
	}
	var v struct {
		ChildPid int `json:"child-pid"`
	}
	if json.Unmarshal(data, &v) != nil || v.ChildPid <= 0 {
		return -1
	}
	fd, err := unix.PidfdOpen(v.ChildPid, 0)
	if err != nil {
		return -1
	}
	if pp := ppidOf(v.ChildPid); pp != bwrapPid && pp != os.Getpid() {
		unix.Close(fd)
		return -1
	}
	return fd
}

// reapInit waits for the init behind pidfd (once bwrap is reaped it is
// dying: --die-with-parent) and reaps it, then closes the pidfd. Not our
// child (we are no subreaper after all): it only waits for the exit.
func reapInit(pidfd int) {
	if pidfd < 0 {
		return
	}
	for {
		err := unix.Waitid(unix.P_PIDFD, pidfd, nil, unix.WEXITED, nil)
		if err != unix.EINTR {
			if err != nil {
				awaitExit([]int{pidfd}, 10*time.Second)
				return
			}
			break
		}
	}
	unix.Close(pidfd)
}
