package bwrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// cgroupJoinScript places a sandbox in its cgroup race-free on a v2
// kernel whose clone3 cannot (before 5.7): the shell writes its own pid
// into each cgroup.procs and only then execs bwrap, so bwrap and
// everything it forks is born inside the cgroup — no window in which a
// process of the sandbox runs outside it, and nothing to chase afterwards.
// (v1 moves the forking thread instead: see cgroup.enterThread.) The cgroup.procs files come opened by boxrt (root) on
// descriptors fdProcs…: the shell already runs as the sandbox user, which
// could not open them, and the kernel checks the opener's credentials.
// "ok" on fdStatus tells boxrt the joins succeeded (the exit status alone
// could not be told apart from the command's). Arguments: the number of
// cgroup.procs descriptors, then bwrap's argv.
const cgroupJoinScript = `n=$1; shift
fd=5
while [ "$fd" -lt $((5+n)) ]; do
	echo $$ 2>/dev/null >&$fd || exit 125
	eval "exec $fd>&-"
	fd=$((fd+1))
done
echo ok >&4
exec 4>&-
exec "$@"`

// Descriptors bwrap (or the join script) starts with, at fixed numbers so
// that bwrap's arguments can name the ones after them before the
// placement method is known: the argument file, the join script's status
// pipe, one cgroup.procs per v1 hierarchy, then whatever bwrapArgs adds.
const (
	fdArgs   = 3
	fdStatus = 4
	fdProcs  = 5
)

// fdBase is the first descriptor number bwrapArgs may use.
func (b *Backend) fdBase() int { return fdProcs + len(b.cg.bases) }

// waitDelay bounds how long Wait lingers for output pipes after bwrap has
// exited. Nothing of the sandbox can hold them then (the pid namespace died
// with bwrap), so this only matters if that guarantee were broken.
const waitDelay = 10 * time.Second

// launch is one bwrap process to start.
type launch struct {
	sessionID string
	key       string // session directory name
	dir       string
	info      backends.Session
	workdir   string
	env       map[string]string
	argv      []string // the command inside the sandbox
	lim       limits
	kind      string // kindExec or kindProcess
	stdin     *os.File
	stdout    io.Writer
	stderr    io.Writer
}

// Kinds of launch. A managed process gets a cgroup of its own,
// <session dir>.<backend token>.p<n>, with its own memory limit; every
// exec of a session joins the session's cgroup (sessionFiles.cgroup).
const (
	kindExec    = "x"
	kindProcess = "p"
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

// argsFile puts bwrap's options on an anonymous memory file for --args, so
// they never appear on a command line.
func argsFile(args []string) (*os.File, error) {
	var f *os.File
	if fd, err := unix.MemfdCreate("boxrt-bwrap-args", unix.MFD_CLOEXEC); err == nil {
		f = os.NewFile(uintptr(fd), "boxrt-bwrap-args")
	} else {
		// Kernels without memfd: an unlinked temporary file does the same.
		if f, err = os.CreateTemp("", "boxrt-bwrap-args-*"); err != nil {
			return nil, boxerr.Failure("bwrap: cannot create argument file: %v", err).Wrap(err)
		}
		_ = os.Remove(f.Name())
	}
	var sb strings.Builder
	for _, a := range args {
		sb.WriteString(a)
		sb.WriteByte(0)
	}
	if _, err := f.WriteString(sb.String()); err != nil {
		f.Close()
		return nil, boxerr.Failure("bwrap: cannot write argument file: %v", err).Wrap(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, boxerr.Failure("bwrap: cannot rewind argument file: %v", err).Wrap(err)
	}
	return f, nil
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

// start builds and starts one sandbox.
//
// Cgroup placement is race-free on both interfaces: on v2 the process is
// cloned straight into its cgroup (clone3 CLONE_INTO_CGROUP through
// SysProcAttr.UseCgroupFD); on v1 it is forked by a thread that was moved
// into the cgroup for that (cgroup.enterThread). Either way the first
// instruction of bwrap already runs under the limits.
func (b *Backend) start(l launch) (*run, error) {
	if b.bwrapErr != nil {
		return nil, b.unavailable()
	}
	if b.idErr != nil {
		return nil, b.idUnavailable()
	}
	r := &run{b: b, key: l.key, done: make(chan struct{}), init: -1}
	if err := b.register(r, l.sessionID, l.dir); err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			// Never started: nothing to wait for. Closing done keeps a
			// StopSession that already saw this run from waiting forever.
			b.unregister(r)
			close(r.done)
		}
	}()
	// Registered first: StopSession closes the session's descriptors only
	// after every registered run is done.
	sf := b.files(l.key)
	lay, err := b.layoutFor(sf, l.dir, l.info, l.workdir, l.env)
	if err != nil {
		return nil, err
	}
	if err := prepareMounts(lay, b.id); err != nil {
		return nil, err
	}
	touch(l.dir)
	fds := &fdList{next: b.fdBase()}
	defer fds.close()
	args, err := bwrapArgs(lay, fds)
	if err != nil {
		return nil, err
	}
	args, infoR, infoW, err := b.withInfoFd(args, fds)
	if err != nil {
		return nil, err
	}
	if infoR != nil {
		defer infoR.Close()
		defer infoW.Close()
	}
	af, err := argsFile(args)
	if err != nil {
		return nil, err
	}
	defer af.Close()

	var cg *cgroup
	if l.kind == kindExec {
		cg, err = sf.cgroup(b, l.lim)
		r.oomBefore, r.pidsBefore = cg.oomKills(), cg.pidsLimitHits()
	} else {
		r.leaf = fmt.Sprintf("%s.%s.%s%d", l.key, b.token, l.kind, b.seq.Add(1))
		cg, err = b.cg.create(b.cfg.InstanceID, r.leaf, l.lim)
		r.own = true
	}
	if err != nil {
		return nil, boxerr.Failure("bwrap: cannot create the sandbox cgroup: %v", err).Wrap(err)
	}
	r.cg = cg
	dropCgroup := func() {
		if r.own {
			cg.remove()
		}
	}

	cmd, statusR, err := b.startPlaced(r, l, af, fds, cg, lay.netns)
	if err != nil {
		dropCgroup()
		return nil, err
	}
	if infoR != nil {
		infoW.Close() // the child has its own: EOF on infoR comes from bwrap
		r.init = initPidfd(infoR, cmd.Process.Pid)
	}
	if statusR != nil {
		joined := joinedCgroups(statusR)
		statusR.Close()
		if !joined {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			dropCgroup()
			return nil, boxerr.Failure("bwrap: could not place the sandbox into its cgroups (%v)", cg.procsFiles())
		}
	}
	r.mu.Lock()
	killNow := r.killRequested
	r.mu.Unlock()
	started = true
	go r.wait()
	if killNow {
		r.kill()
	}
	return r, nil
}

// startPlaced starts bwrap in its cgroup: cloned into it on v2 (through
// the join script on kernels whose clone3 lacks CLONE_INTO_CGROUP, before
// 5.7), forked by a thread inside it on v1. statusR, when not nil, carries
// the script's verdict.
func (b *Backend) startPlaced(r *run, l launch, af *os.File, fds *fdList, cg *cgroup, netns *os.File) (*exec.Cmd, *os.File, error) {
	cloneInto := cg != nil && b.cg.version == cgroupV2 && !b.cg.noCloneInto.Load()
	cmd, statusR, err := b.startCmd(r, l, af, fds, cg, netns, cloneInto)
	if err != nil && cloneInto && (errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.EINVAL) ||
		errors.Is(err, syscall.E2BIG) || errors.Is(err, syscall.EOPNOTSUPP)) {
		b.cg.noCloneInto.Store(true)
		cmd, statusR, err = b.startCmd(r, l, af, fds, cg, netns, false)
	}
	return cmd, statusR, err
}

func (b *Backend) startCmd(r *run, l launch, af *os.File, fds *fdList, cg *cgroup, netns *os.File, cloneInto bool) (*exec.Cmd, *os.File, error) {
	if _, err := af.Seek(0, io.SeekStart); err != nil {
		return nil, nil, boxerr.Failure("bwrap: rewind argument file: %v", err).Wrap(err)
	}
	cmd := b.bwrapCmd(context.Background(), af, fds, l.argv)
	cmd.Stdout, cmd.Stderr = l.stdout, l.stderr
	if l.stdin != nil {
		cmd.Stdin = l.stdin
	}
	extra, bwrapArgv := cmd.ExtraFiles, cmd.Args
	var statusR, statusW *os.File
	var thread *cgroup // v1: the cgroup the forking thread enters
	switch {
	case cg == nil:
	case b.cg.version == cgroupV1:
		thread = cg
	case cloneInto:
		fd, err := unix.Open(cg.dirs[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, boxerr.Failure("bwrap: cannot open cgroup %s: %v", cg.dirs[0], err).Wrap(err)
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
	default:
		var err error
		if statusR, statusW, err = os.Pipe(); err != nil {
			return nil, nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
		}
		// The child has its own copy after Start; ours must go so that EOF
		// on statusR comes from the child.
		defer statusW.Close()
		extra[fdStatus-3] = statusW
		procs := cg.procsFiles()
		for i, p := range procs {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				statusR.Close()
				return nil, nil, boxerr.Failure("bwrap: cannot open %s: %v", p, err).Wrap(err)
			}
			defer f.Close()
			extra[fdProcs-3+i] = f
		}
		cmd.Path = b.sh
		cmd.Args = append([]string{b.sh, "-c", cgroupJoinScript, "boxrt-cgroup-join", strconv.Itoa(len(procs))}, bwrapArgv...)
	}
	r.mu.Lock()
	var err error
	if netns != nil || thread != nil {
		err = startOnThread(netns, thread, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err == nil {
		r.cmd = cmd
	}
	r.mu.Unlock()
	if err != nil {
		if cmd.Process != nil { // started, but its thread could not go home
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if statusR != nil {
			statusR.Close()
		}
		return nil, nil, boxerr.Failure("bwrap: cannot start %s: %v", cmd.Path, err).Wrap(err)
	}
	return cmd, statusR, nil
}

// bwrapCmd is bwrap with its options on fdArgs, the fixed descriptor
// slots (nil = closed in the child) and then bwrapArgs' descriptors,
// running as the sandbox user.
func (b *Backend) bwrapCmd(ctx context.Context, af *os.File, fds *fdList, argv []string) *exec.Cmd {
	extra := make([]*os.File, fds.next-fdArgs, fds.next-fdArgs+len(fds.files))
	extra[fdArgs-3] = af
	extra = append(extra, fds.files...)
	cmd := exec.CommandContext(ctx, b.bwrap, append([]string{"--args", strconv.Itoa(fdArgs)}, argv...)...)
	cmd.Env = []string{} // not nil: nil would hand bwrap our environment
	cmd.ExtraFiles = extra
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group: a terminal's ^C to boxrt's group does not
		// reach sandboxes.
		Setpgid: true,
		// If boxrt dies, bwrap dies, and --die-with-parent takes the
		// sandbox with it. (Go arms it after switching credentials.)
		Pdeathsig: syscall.SIGKILL,
		// Never host root: see SandboxUser.
		Credential: b.id.cred,
	}
	return cmd
}

// joinedCgroups reads the join script's status until EOF.
func joinedCgroups(f *os.File) bool {
	_ = f.SetReadDeadline(time.Now().Add(10 * time.Second))
	data, err := io.ReadAll(f)
	return err == nil && strings.TrimSpace(string(data)) == "ok"
}

// wait reaps bwrap, then clears an own cgroup, then unregisters the run.
// Once bwrap is gone its pid namespace is too: its init died through
// --die-with-parent (or with the command), and a pid namespace dies with
// its init. The cgroup kill in remove is the second line of defence.
//
// The limit counters of a shared (session) cgroup are read as the change
// since the start: an OOM kill or refused fork of another exec of the
// session running at the same time is counted too.
//
// Init outlives bwrap briefly: tearing down the namespaces (the mount
// namespace's dozens of mounts above all) takes a few milliseconds more.
// An own cgroup is removed only after init is reaped; with the session's
// cgroup the run is done before that, as a bare bwrap's caller is, and the
// reaping follows at once.
func (r *run) wait() {
	err := r.cmd.Wait()
	r.state = r.cmd.ProcessState
	r.waitErr = err
	r.mu.Lock()
	oomBefore, pidsBefore := r.oomBefore, r.pidsBefore
	r.mu.Unlock()
	r.oomKills = r.cg.oomKills() - oomBefore
	r.pidsHits = r.cg.pidsLimitHits() - pidsBefore
	if r.own {
		reapInit(r.init)
		r.cg.remove()
	}
	r.b.unregister(r)
	close(r.done)
	if !r.own {
		reapInit(r.init)
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

// procState is the state letter of /proc/<pid>/stat (0 when unreadable).
func procState(pid int) rune {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 || i+2 >= len(data) {
		return 0
	}
	return rune(data[i+2])
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

// ppidOf reads a process's parent pid from /proc (-1 when gone).
func ppidOf(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	return parseStatPPID(string(data))
}

// parseStatPPID extracts the ppid from /proc/<pid>/stat: "pid (comm) state
// ppid …", where comm may itself contain spaces and parentheses.
func parseStatPPID(stat string) int {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return -1
	}
	pp, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return pp
}

// children lists the direct children of pid from /proc.
func children(pid int) []int {
	var out []int
	forEachProc(func(p, ppid int) {
		if ppid == pid {
			out = append(out, p)
		}
	})
	return out
}

// forEachProc calls fn with every process's pid and parent pid.
func forEachProc(fn func(pid, ppid int)) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if pp := parseStatPPID(string(data)); pp >= 0 {
			fn(p, pp)
		}
	}
}

// descendants lists the transitive children of pid from /proc (used to
// find the sandbox's processes when there is no cgroup).
func descendants(pid int) []int {
	children := map[int][]int{}
	forEachProc(func(p, pp int) { children[pp] = append(children[pp], p) })
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !slices.Contains(out, c) {
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out
}

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
		r, err = b.start(launch{
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
		if err != nil {
			return backends.ExitStatus{}, err
		}
	}
	xio.started()
	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	timedOut, canceled := false, false
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
	switch {
	case r.wasStopped():
		return backends.ExitStatus{}, boxerr.Failure("session %s was stopped while the command was running", info.SessionID)
	case canceled:
		return backends.ExitStatus{}, ctx.Err()
	}
	if req.Stderr != nil {
		// Say why, in the stream the caller (often an LLM) reads: a bare
		// exit status 137 or a timeout explains nothing.
		if r.oomKills > 0 {
			fmt.Fprintf(req.Stderr, "\nboxrt: the memory limit (%d MiB) killed %d process(es)\n", limitsOf(info, 0).memoryMB, r.oomKills)
		}
		if r.pidsHits > 0 {
			fmt.Fprintf(req.Stderr, "\nboxrt: the process limit (%d) refused %d fork(s)\n", info.PidsLimit, r.pidsHits)
		}
	}
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

// StartProcess implements backends.Backend: a managed process in a fresh
// sandbox of the session (with the session's mounts, network and limits;
// spec.MemoryMB > 0 overrides the memory limit), with real pipes.
func (b *Backend) StartProcess(ctx context.Context, info backends.Session, spec backends.ProcessSpec) (backends.Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(spec.Command) == "" {
		return nil, boxerr.Validation("command", "command must not be empty")
	}
	for i, a := range append([]string{spec.Command}, spec.Args...) {
		if strings.ContainsRune(a, 0) {
			return nil, boxerr.Validation("args", "argument %d contains a NUL byte", i)
		}
	}
	if spec.MemoryMB != 0 && spec.MemoryMB < backends.MinMemoryMB {
		return nil, boxerr.Validation("memory_mb", "memory_mb must be 0 or at least %d, got %d", backends.MinMemoryMB, spec.MemoryMB)
	}
	dir, err := b.lookup(info)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (*os.File, *os.File, error) {
		rd, wr, err := os.Pipe()
		if err == nil {
			files = append(files, rd, wr)
		}
		return rd, wr, err
	}
	inR, inW, err1 := pipe()
	outR, outW, err2 := pipe()
	errR, errW, err3 := pipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		closeAll()
		return nil, boxerr.Failure("bwrap: pipe: %v", err).Wrap(err)
	}
	// exec "$0" "$@": the shell resolves the command on PATH (and reads a
	// profile, like the reference's sh -lc) and then becomes it, so signals
	// reach the server itself.
	argv := append([]string{"/bin/sh", "-lc", `exec "$0" "$@"`, spec.Command}, spec.Args...)
	r, err := b.start(launch{
		sessionID: info.SessionID,
		key:       info.BackendSessionID,
		dir:       dir,
		info:      info,
		workdir:   strings.TrimSpace(spec.Cwd),
		env:       spec.Env,
		argv:      argv,
		lim:       limitsOf(info, spec.MemoryMB),
		kind:      kindProcess,
		stdin:     inR,
		stdout:    outW,
		stderr:    errW,
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	// The child holds its ends now; ours would keep EOF from ever coming.
	inR.Close()
	outW.Close()
	errW.Close()
	return &process{r: r, stdin: inW, stdout: &eofCloser{f: outR}, stderr: &eofCloser{f: errR}}, nil
}

// process is a managed process (backends.Process).
type process struct {
	r      *run
	stdin  *os.File
	stdout io.Reader
	stderr io.Reader
}

func (p *process) Stdin() io.WriteCloser { return p.stdin }
func (p *process) Stdout() io.Reader     { return p.stdout }
func (p *process) Stderr() io.Reader     { return p.stderr }

// Wait returns the exit code: the command's status as bwrap relays it, or
// the negative signal number when the process was killed by a signal —
// either bwrap itself (SIGKILL through Signal or StopSession) or the
// command by a signal sent with Signal (bwrap reports that as 128+n).
func (p *process) Wait() (int, error) {
	r := p.r
	<-r.done
	if r.state == nil {
		return -1, boxerr.Failure("bwrap: %v", r.waitErr).Wrap(r.waitErr)
	}
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -int(ws.Signal()), nil
	}
	code := r.state.ExitCode()
	r.mu.Lock()
	last := r.lastSignal
	r.mu.Unlock()
	if last != 0 && code == 128+int(last) {
		return -int(last), nil
	}
	return code, nil
}

// Signal sends sig to the whole process tree (SIGKILL: the whole sandbox).
func (p *process) Signal(sig syscall.Signal) error { return p.r.signal(sig) }

// eofCloser closes its pipe once it has been read to the end, so a
// consumer that drains the stream does not leak the descriptor (Process
// hands out readers, not ReadClosers). Wait does not close it: output
// still buffered in the pipe stays readable after the process exits.
type eofCloser struct {
	f   *os.File
	mu  sync.Mutex
	err error
}

func (e *eofCloser) Read(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.f.Read(p)
	if err != nil {
		e.err = err
		e.f.Close()
	}
	return n, err
}
