package bwrap

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
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

// launch is one bwrap process to start: a session's resident sandbox.
type launch struct {
	sessionID string
	key       string // session directory name
	dir       string
	info      backends.Session
	workdir   string
	env       map[string]string
	argv      []string // the command inside the sandbox
	lim       limits
	agent     *agentMounts
	persist   bool // see layout.persist
	stdout    io.Writer
	stderr    io.Writer
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
	lay.agent, lay.persist = l.agent, l.persist
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

	cg, err := sf.cgroup(b, l.lim)
	if err != nil {
		return nil, boxerr.Failure("bwrap: cannot create the sandbox cgroup: %v", err).Wrap(err)
	}
	r.cg = cg

	cmd, statusR, err := b.startPlaced(r, l, af, fds, cg, lay.netns)
	if err != nil {
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
	if l.persist {
		cmd.SysProcAttr.Pdeathsig = 0
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
	if p := (placement{stage: b.files(l.key).stage, netns: netns, cg: thread}); p.needsThread() {
		err = b.startOnThread(p, cmd.Start)
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
