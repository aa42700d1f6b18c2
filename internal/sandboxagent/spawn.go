package sandboxagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// defaultPath is the search path when the environment has no PATH.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxRemembered bounds the exited ids the agent still signals by.
const maxRemembered = 4096

// spawn starts m with fds (the pty slave; the stdin and output pipes of a
// terminal it makes; or stdin, stdout and stderr) and answers started or
// failed. It closes fds. onStart, if not nil, is called with the child's
// pid under a.mu before started is sent.
func (a *agent) spawn(m *spawnMsg, fds []int, onStart func(pid int)) error {
	defer closeFDs(fds)
	// Outside the lock: a stat in the sandbox may be slow (a hung mount),
	// and the reaper must not wait for it.
	argv0, attr, err := prepare(m, fds)
	var r *relay
	if err == nil && m.Term != nil {
		r, err = openRelay(m.Term, fds, attr)
	}
	defer r.release()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, used := a.ids[m.ID]; used || m.ID == 0 {
		return a.sendLocked(failedMsg{Op: opFailed, ID: m.ID, Error: fmt.Sprintf("spawn id %d is 0 or already used", m.ID)})
	}
	var pid int
	if err == nil {
		pid, err = syscall.ForkExec(argv0, m.Argv, attr)
		if err != nil {
			err = fmt.Errorf("cannot run %q: %v", m.Argv[0], err)
		}
	}
	if err != nil {
		return a.sendLocked(failedMsg{Op: opFailed, ID: m.ID, Error: cut(err.Error())})
	}
	select {
	case a.forked <- struct{}{}:
	default: // the reaper is awake already
	}
	a.live[pid] = m.ID
	a.ids[m.ID] = pid
	if r != nil {
		a.relays[pid] = r
		r.start()
	}
	if onStart != nil {
		onStart(pid)
	}
	return a.sendLocked(startedMsg{Op: opStarted, ID: m.ID, PID: pid})
}

// prepare checks m and makes its fork's attributes: a session leader (its
// pgid is its pid, for signals to its group), with the pty slave as its
// controlling terminal.
func prepare(m *spawnMsg, fds []int) (string, *syscall.ProcAttr, error) {
	if len(m.Argv) == 0 {
		return "", nil, errors.New("argv is empty")
	}
	if err := checkStrings("argv", m.Argv); err != nil {
		return "", nil, err
	}
	if err := checkStrings("env", m.Env); err != nil {
		return "", nil, err
	}
	dir := m.Dir
	if dir == "" {
		dir = "/"
	}
	if !filepath.IsAbs(dir) {
		return "", nil, fmt.Errorf("working directory %q is not absolute", dir)
	}
	if st, err := os.Stat(dir); err != nil {
		return "", nil, fmt.Errorf("working directory %q: %v", dir, errors.Unwrap(err))
	} else if !st.IsDir() {
		return "", nil, fmt.Errorf("working directory %q is not a directory", dir)
	}
	argv0, err := lookPath(m.Argv[0], m.Env, dir)
	if err != nil {
		return "", nil, err
	}
	// Three descriptors are stdin, stdout and stderr; the one pty slave
	// is all three.
	files := make([]uintptr, 3)
	for i := range files {
		files[i] = uintptr(fds[min(i, len(fds)-1)])
	}
	return argv0, &syscall.ProcAttr{
		Dir:   dir,
		Env:   m.Env,
		Files: files,
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: m.TTY, Ctty: 0},
	}, nil
}

// lookPath finds name as the child's execve would with env's PATH; a
// name with a slash is taken as it is (relative to dir).
func lookPath(name string, env []string, dir string) (string, error) {
	if name == "" {
		return "", errors.New("argv[0] is empty")
	}
	if strings.Contains(name, "/") {
		return name, nil
	}
	search := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			search = v
		}
	}
	for _, d := range filepath.SplitList(search) {
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && unix.Access(p, unix.X_OK) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in PATH %q", name, cut(search))
}

// signal sends m's signal to the group of m's process, running or
// exited (its group may outlive it). An exited id's pid may since have
// gone to a new child of the agent: that one is not signaled by the old id.
func (a *agent) signal(m *signalMsg) {
	if m.Signal <= 0 || m.Signal > maxSignal {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	pid, ok := a.ids[m.ID]
	if !ok {
		return
	}
	if id, live := a.live[pid]; live && id != m.ID {
		return
	}
	unix.Kill(-pid, unix.Signal(m.Signal))
}

// reap is the one wait4(-1) loop: it reaps every child and orphan of the
// sandbox and reports the exits of the connection's children. It waits in
// wait4 itself (holding a thread: spareThreads) rather than for SIGCHLD,
// which reaches a goroutine only through the runtime's signal thread and
// two more wake-ups: a good part of the time between a command's end and
// its exited. With no child at all it waits for the next fork (forked) or
// for SIGCHLD (chld): a container's pid 1 also adopts the orphans of an
// engine's exec, which it never forked, and hears of them when they exit.
func (a *agent) reap(chld <-chan os.Signal) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.ECHILD):
			select {
			case <-a.forked:
			case <-chld:
			}
		case err != nil:
			// Not a status wait4 gives; do not spin on it.
			fmt.Fprintf(os.Stderr, "boxrt agent: wait4: %v\n", err)
			time.Sleep(100 * time.Millisecond)
		default:
			a.exited(pid, syscall.WaitStatus(ws))
		}
	}
}

// exited reports pid's end if the connection tracks it.
func (a *agent) exited(pid int, ws syscall.WaitStatus) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.relayExited(pid)
	conns := a.served
	if conns == nil {
		conns = []*agent{a}
	}
	for _, c := range conns {
		if id, ok := c.live[pid]; ok {
			c.exitedLocked(pid, id, ws)
			return
		}
	}
}

// exitedLocked reports the end of pid, the connection's process id; a.mu
// is held.
func (a *agent) exitedLocked(pid int, id uint64, ws syscall.WaitStatus) {
	delete(a.live, pid)
	a.gone = append(a.gone, id)
	if len(a.gone) > maxRemembered {
		delete(a.ids, a.gone[0])
		a.gone = a.gone[1:]
	}
	e := exitOf(ws)
	if sp := a.streams[id]; sp != nil {
		// Its exited follows its last output.
		go a.finishStream(a.fc, id, sp, e)
		return
	}
	// A failed write drops the connection; its reader sees it.
	if err := a.sendLocked(exitedMsg{Op: opExited, ID: id, Code: &e.Code, Signal: &e.Signal}); err != nil {
		a.fc.c.Close()
	}
}

// exitOf is the Exit of a wait status.
func exitOf(ws syscall.WaitStatus) Exit {
	if ws.Signaled() {
		return Exit{Code: 128 + int(ws.Signal()), Signal: int(ws.Signal())}
	}
	return Exit{Code: ws.ExitStatus()}
}

// cut bounds a text the agent sends, keeping it UTF-8.
func cut(s string) string {
	if len(s) > maxReason {
		s = s[:maxReason-len("…")] + "…"
	}
	return strings.ToValidUTF8(s, "")
}
