package bwrap

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A session with network: on gets a network namespace of its own (never
// the host's: that one reaches boxrt's loopback listener and every other
// service bound to 127.0.0.1), made once per session and pinned by a bind
// mount in its stage (stage.go). slirp4netns connects it to the outside in
// user space for the session's lifetime: tap0 10.0.2.100/24, gateway
// 10.0.2.2, DNS 10.0.2.3 (the sandbox's /etc/resolv.conf names it). With
// --disable-host-loopback the gateway does not lead to the host's
// 127.0.0.1; the host's other addresses are reachable like any outside
// address. Each sandbox of the session is started inside that namespace
// (bwrap --share-net shares it, not the host's).
//
// The namespace belongs to the initial user namespace, so the sandbox's
// uid 0 has no power over it (no reconfiguring tap0 or routes). slirp4netns
// runs as root, needed to enter it, but in a mount namespace of its own
// with every capability dropped (--enable-sandbox) under its own seccomp
// filter (--enable-seccomp); --exit-fd ends it with the session.

// slirpResolvConf is the sandbox's resolv.conf with network: on.
const slirpResolvConf = "nameserver 10.0.2.3\n"

// netReadyTimeout bounds how long session setup waits for slirp4netns.
const netReadyTimeout = 10 * time.Second

// netnsFile is the session's network namespace in its stage.
const netnsFile = "netns"

// sessionNet is a session's network namespace and its slirp4netns.
type sessionNet struct {
	ns    *os.File
	slirp *slirp
}

func (n *sessionNet) close() {
	if n != nil {
		n.slirp.stop()
		n.ns.Close()
	}
}

// makeNet creates the network namespace of the session staged at stage
// and starts slirp4netns on it. On failure it leaves no pin behind: a
// namespace still bind-mounted at the path would make every later attempt
// fail (the pin file cannot be rewritten), so the session could never get
// its network until it was staged again.
func (b *Backend) makeNet(stage string) (_ *sessionNet, err error) {
	if b.slirpErr != nil {
		return nil, b.slirpUnavailable()
	}
	path := filepath.Join(stage, netnsFile)
	if pinned(path) {
		// An adopted sandbox's namespace (persist.go): its slirp4netns
		// died with the boxrt that started it.
		return b.reconnectNet(path)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, unpin(path))
		}
	}()
	// A child makes it (and pins it at path): a Go thread that left its
	// namespace for good would have to end, and a thread's end kills the
	// children it forked (Pdeathsig).
	if out, err := exec.Command(b.unshare, "--net="+path, "true").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("create the network namespace: %v: %s", err, out)
	}
	return b.reconnectNet(path)
}

// pinned reports whether a network namespace is mounted at path.
func pinned(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// reconnectNet starts slirp4netns on the namespace pinned at path: a new
// one, or one an earlier boxrt left to a persistent sandbox.
func (b *Backend) reconnectNet(path string) (*sessionNet, error) {
	ns, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	s, err := b.startSlirp(path)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &sessionNet{ns: ns, slirp: s}, nil
}

// unpin detaches a network namespace pinned at path, if one is, and
// removes the pin file.
func unpin(path string) error {
	var errs []error
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		errs = append(errs, fmt.Errorf("unmount %s: %w", path, err))
	}
	if err := os.Remove(path); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// slirp is a running slirp4netns.
type slirp struct {
	cmd   *exec.Cmd
	exitW *os.File
}

// startSlirp starts slirp4netns on the namespace pinned at path and waits
// until it has configured tap0.
func (b *Backend) startSlirp(path string) (*slirp, error) {
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer readyR.Close()
	exitR, exitW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return nil, err
	}
	cmd := exec.Command(b.slirp, "--configure", "--mtu=65520", "--disable-host-loopback",
		"--enable-sandbox", "--enable-seccomp", "--ready-fd=3", "--exit-fd=4",
		"--netns-type=path", path, "tap0")
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{readyW, exitR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &limitedBuffer{max: 4096}
	cmd.Stdout, cmd.Stderr = out, out
	err = cmd.Start()
	readyW.Close()
	exitR.Close()
	if err != nil {
		exitW.Close()
		return nil, fmt.Errorf("start slirp4netns: %w", err)
	}
	s := &slirp{cmd: cmd, exitW: exitW}
	_ = readyR.SetReadDeadline(time.Now().Add(netReadyTimeout))
	if _, err := readyR.Read(make([]byte, 1)); err != nil {
		s.stop()
		return nil, fmt.Errorf("slirp4netns did not configure the network: %v: %s", err, out.String())
	}
	return s, nil
}

// startOnThread runs start (which forks bwrap) on a locked OS thread that
// first enters the session's network namespace ns and, on cgroup v1, the
// cgroup cg (either may be nil), so that the child is born in both. The
// thread must outlive the child (Pdeathsig is tied to the thread that
// forked it), so it goes back afterwards rather than ending; one that
// cannot go back is never reused elsewhere: it stays parked.
func startOnThread(ns *os.File, cg *cgroup, start func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := enterAndStart(ns, cg, start)
		if errors.Is(err, errThreadAway) {
			errc <- err // not expected of root
			select {}
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// errThreadAway marks a thread that could not return to boxrt's own
// network namespace or cgroups.
var errThreadAway = errors.New("the thread could not return")

func enterAndStart(ns *os.File, cg *cgroup, start func() error) (err error) {
	if ns != nil {
		home, oerr := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if oerr != nil {
			return fmt.Errorf("open boxrt's network namespace: %w", oerr)
		}
		defer unix.Close(home)
		if serr := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); serr != nil {
			return fmt.Errorf("enter the session's network namespace: %w", serr)
		}
		defer func() {
			if herr := unix.Setns(home, unix.CLONE_NEWNET); herr != nil {
				err = errors.Join(err, fmt.Errorf("%w: leave the session's network namespace: %w", errThreadAway, herr))
			}
		}()
	}
	if cg != nil {
		leave, cerr := cg.enterThread()
		if cerr != nil {
			return fmt.Errorf("place the sandbox into its cgroup: %w", cerr)
		}
		defer func() {
			if lerr := leave(); lerr != nil {
				err = errors.Join(err, fmt.Errorf("%w: %w", errThreadAway, lerr))
			}
		}()
	}
	return start()
}

// stop ends slirp4netns and reaps it. Safe on nil.
func (s *slirp) stop() {
	if s == nil {
		return
	}
	s.exitW.Close()
	done := make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

// limitedBuffer keeps the first max bytes written (slirp4netns' messages
// for an error).
type limitedBuffer struct {
	max int
	buf []byte
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - len(l.buf); room > 0 {
		l.buf = append(l.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.buf) }
