package bwrap

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/egress"
)

// A session with network (on or a policy) gets a network namespace of its
// own (never the host's: that one reaches boxrt's loopback listener and
// every other service bound to 127.0.0.1), made once per session and
// pinned by a bind mount in its stage (stage.go). boxrt's egress proxy is
// attached to it (internal/egress): loopback, a default route into
// loopback and nftables rules that send every TCP connection to the proxy
// and every DNS query to its resolver, dropping the rest. The proxy dials
// out from boxrt's own namespace and decides each connection by the
// session's policy ("on": any public address, never loopback, private,
// link-local or metadata ranges nor the host's own addresses). Each
// sandbox of the session is started inside that namespace (bwrap
// --share-net shares it, not the host's).
//
// The namespace belongs to the initial user namespace, so the sandbox's
// uid 0 has no power over it (no rewriting the rules or routes). The
// proxy's listeners in it are boxrt's sockets: nothing of boxrt runs in
// the sandbox. Slirp4netns, which gave network: on its link before, is no
// longer used: it could not keep the sandbox from the host's non-loopback
// addresses nor the metadata range, and it cost a process per session.

// netResolvConf is the sandbox's resolv.conf with network: any address
// that is not loopback reaches the proxy's resolver on port 53.
const netResolvConf = "nameserver 10.0.2.3\n"

// egressCAPath is where a session with secrets finds the CA bundle its
// TLS clients are pointed at (egress.TrustEnv): the host's roots plus the
// session's CA, which signs only the hosts that carry a secret.
const egressCAPath = "/run/boxrt-egress/ca.pem"

// netnsFile is the session's network namespace in its stage.
const netnsFile = "netns"

// sessionNet is a session's network namespace and its egress session.
type sessionNet struct {
	ns *os.File
	eg *egress.Session
}

func (n *sessionNet) close() {
	if n != nil {
		n.eg.Close()
		n.ns.Close()
	}
}

// makeNet creates the network namespace of the session staged at stage
// (or reopens the one pinned there) and attaches the egress proxy to it.
// On failure it leaves no new pin behind: a namespace still bind-mounted
// at the path would make every later attempt fail (the pin file cannot be
// rewritten), so the session could never get its network until it was
// staged again.
func (b *Backend) makeNet(stage string, att egress.Attachment) (_ *sessionNet, err error) {
	if b.netErr != nil {
		return nil, b.netUnavailable()
	}
	path := filepath.Join(stage, netnsFile)
	if !pinned(path) {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				err = errors.Join(err, unpin(path))
			}
		}()
		// A child makes it (and pins it at path): a Go thread that left
		// its namespace for good would have to end, and a thread's end
		// kills the children it forked (Pdeathsig).
		if out, err := exec.Command(b.unshare, "--net="+path, "true").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("create the network namespace: %v: %s", err, out)
		}
	}
	ns, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	att.NetNS = ns
	eg, err := b.cfg.Egress.Attach(att)
	if err != nil {
		ns.Close()
		return nil, err
	}
	return &sessionNet{ns: ns, eg: eg}, nil
}

// egressEnv is what the session's commands get from its egress session:
// each secret's placeholder and, with secrets, the variables naming the
// CA bundle (returned too, for the sandbox to bind). Under the caller's
// network() call, so sf.net is set.
func (sf *sessionFiles) egressEnv() (map[string]string, []byte, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.net == nil {
		return nil, nil, nil
	}
	env := sf.net.eg.Env()
	ca, err := sf.net.eg.CABundle()
	if err != nil || ca == nil {
		return env, nil, err
	}
	maps.Copy(env, egress.TrustEnv(egressCAPath))
	return env, ca, nil
}

// pinned reports whether a network namespace is mounted at path.
func pinned(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
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

// placement is where a sandbox's bwrap is born besides its cgroup on v2:
// the session's stage (bwrap then starts from a mount namespace holding
// only that stage: mountns.go), its network namespace, and on cgroup v1
// its cgroup. Each may be empty.
type placement struct {
	stage string
	netns *os.File
	cg    *cgroup
}

func (p placement) needsThread() bool { return p.stage != "" || p.netns != nil || p.cg != nil }

// startOnThread runs start (which forks bwrap) on a locked OS thread that
// first enters the placement, so that the child is born there. The thread
// must outlive the child (Pdeathsig is tied to the thread that forked it),
// so it goes back afterwards rather than ending; one that cannot go back
// is never reused elsewhere: it stays parked.
func (b *Backend) startOnThread(p placement, start func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		err := b.enterAndStart(p, start)
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
// namespaces or cgroups.
var errThreadAway = errors.New("the thread could not return")

func (b *Backend) enterAndStart(p placement, start func() error) (err error) {
	goBack := func(leave func() error) {
		if lerr := leave(); lerr != nil {
			err = errors.Join(err, fmt.Errorf("%w: %w", errThreadAway, lerr))
		}
	}
	if p.stage != "" {
		goHome, merr := b.enterSessionMounts(p.stage)
		if merr != nil {
			return fmt.Errorf("enter the session's mount namespace: %w", merr)
		}
		defer goBack(goHome)
	}
	if p.netns != nil {
		home, oerr := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if oerr != nil {
			return fmt.Errorf("open boxrt's network namespace: %w", oerr)
		}
		defer unix.Close(home)
		if serr := unix.Setns(int(p.netns.Fd()), unix.CLONE_NEWNET); serr != nil {
			return fmt.Errorf("enter the session's network namespace: %w", serr)
		}
		defer goBack(func() error {
			if herr := unix.Setns(home, unix.CLONE_NEWNET); herr != nil {
				return fmt.Errorf("leave the session's network namespace: %w", herr)
			}
			return nil
		})
	}
	if p.cg != nil {
		leave, cerr := p.cg.enterThread()
		if cerr != nil {
			return fmt.Errorf("place the sandbox into its cgroup: %w", cerr)
		}
		defer goBack(leave)
	}
	return start()
}
