package bwrap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// Every directory bwrap binds from the host is an O_PATH descriptor boxrt
// opened without following a symlink, passed with --bind-fd /
// --ro-bind-fd. A path string is resolved exactly once, when its
// descriptor is opened; later execs and managed processes mount the same
// descriptor, so a directory swapped for a symlink (to /etc, say) after
// the allow-list check can no longer redirect a mount. bwrap re-checks
// that what it mounted is the descriptor's inode and refuses otherwise.

// openBeneath is backends.OpenDir with bwrap's ownership rule: directories
// it makes for the sandbox (owned) belong to the sandbox user.
func openBeneath(dirfd int, rel string, create, owned bool, id identity) (fd int, created bool, err error) {
	var onCreate func(parent int, name string) error
	if owned {
		onCreate = id.chown
	}
	return backends.OpenDir(dirfd, rel, create, onCreate)
}

// openHostDir opens a caller's host directory (already checked against the
// allow-list by the runtime, as a symlink-free path) for mounting.
func openHostDir(field, path string, create, owned bool, id identity) (*os.File, error) {
	if !filepath.IsAbs(path) || strings.ContainsRune(path, 0) {
		return nil, boxerr.Validation(field, "%s must be absolute, got %q", field, path)
	}
	path = filepath.Clean(path)
	fd, _, err := openBeneath(unix.AT_FDCWD, path, create, owned, id)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return nil, boxerr.Validation(field, "%s %s is not a plain directory (a symlink or a file is in its path)", field, path).
				With("path", path).Wrap(err)
		}
		return nil, boxerr.Failure("bwrap: cannot open host directory %s: %v", path, err).Wrap(err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// sessionFiles are the descriptors of one session, opened on first use and
// kept until StopSession: its own workspace, tmp and home, and every host
// directory (host_path, extra mounts, skills, image) by path and mode —
// staged (stage.go) when boxrt is root — and the cgroup its execs share.
type sessionFiles struct {
	key string

	mu            sync.Mutex
	ready         bool
	stage         string // "" = no staging (boxrt is not root)
	ws, tmp, home *os.File
	net           *sessionNet
	// secrets are the spec's, kept in memory only (never in session.json)
	// for the egress proxy to carry to their hosts.
	secrets     []egress.Secret
	cg          *cgroup
	host        map[hostKey]*os.File
	staged      int  // h<n> names used so far
	opened      int  // host directories opened so far (generation)
	agentStaged bool // the agent binary is mounted in the stage
	closed      bool
	// adopted: a persistent session's sandbox an earlier boxrt left
	// running, to take over on first use (persist.go).
	adopted *sandboxRecord

	res resident // the session's resident sandbox (its own lock)
}

// init makes the session's stage on first use (under sf.mu).
func (sf *sessionFiles) init(b *Backend) error {
	if sf.closed {
		return errSessionClosed
	}
	if !sf.ready {
		sf.adoptStage(b)
	}
	if !sf.ready {
		stage, err := b.stageFor(sf.key)
		if err != nil {
			return fmt.Errorf("stage directory: %w", err)
		}
		sf.stage, sf.ready = stage, true
	}
	return nil
}

// close closes the descriptors and detaches the stage with everything
// mounted in it (the disk, and with it its loop device).
func (sf *sessionFiles) close() error {
	sf.res.close() // before the stage goes: its socket lies there
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.closed = true
	for _, f := range []*os.File{sf.ws, sf.tmp, sf.home} {
		if f != nil {
			f.Close()
		}
	}
	for _, f := range sf.host {
		f.Close()
	}
	sf.net.close()
	sf.cg.remove()
	sf.ws, sf.tmp, sf.home, sf.host, sf.net, sf.cg = nil, nil, nil, nil, nil, nil
	if sf.stage == "" {
		return nil
	}
	return unstage(sf.stage)
}

// releaseCgroup removes the cgroup of a session whose sandbox no longer
// runs, as boxrt closes: nothing is in it, a later boxrt on this state
// directory would remove the leaf anyway (Adopt) and makes a new one when
// it starts the sandbox again, and a state directory deleted meanwhile
// would otherwise leave it behind for good.
func (sf *sessionFiles) releaseCgroup() {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.cg.remove()
	sf.cg = nil
}

// detachNet stops serving the session's network (its egress session),
// leaving its namespace pinned with its rules: a detached sandbox stays
// cut off until the next sandbox attaches the proxy again.
func (sf *sessionFiles) detachNet() {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	sf.net.close()
	sf.net = nil
}

// hostDir returns the descriptor of a host directory, opening (and
// staging) it the first time the session uses that path in that mode,
// since the first use's mode must not decide later ones'. owned (rw): the
// sandbox must be able to write it. Without root, a directory boxrt
// creates is the sandbox user's anyway; as root, the stage clone is
// idmapped instead (idmap.go) and a created directory stays root's.
func (sf *sessionFiles) hostDir(b *Backend, field, path string, create, owned bool) (*os.File, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if err := sf.init(b); err != nil {
		return nil, err
	}
	key := hostKey{path, owned}
	if f := sf.host[key]; f != nil {
		if !removed(f) {
			return f, nil
		}
		// The directory was deleted (and maybe re-created):
		// its descriptor would mount a dead or other directory, and bwrap
		// fails with "Can't find source path". The path is opened afresh
		// below, no symlink followed, so it is the same symlink-free
		// string the allow-list admitted. A staged clone of the old
		// directory stays attached in the stage until StopSession.
		f.Close()
		delete(sf.host, key)
	}
	f, err := openHostDir(field, path, create, owned && sf.stage == "", b.id)
	if err != nil {
		return nil, err
	}
	if sf.stage != "" {
		var idmap *os.File
		if owned {
			if idmap, err = b.idmapUserns(); err != nil {
				f.Close()
				return nil, boxerr.Failure("bwrap: %v", err).Wrap(err)
			}
		}
		staged, err := sf.stageDir(f, sf.staged, idmap)
		sf.staged++
		f.Close()
		if err != nil {
			return nil, boxerr.Failure("bwrap: cannot stage %s %s: %v", field, path, err).Wrap(err)
		}
		f = staged
	}
	if sf.host == nil {
		sf.host = map[hostKey]*os.File{}
	}
	sf.host[key] = f
	sf.opened++
	return f, nil
}

// generation changes whenever a host directory is opened (afresh): a
// sandbox started before binds what may be a deleted directory.
func (sf *sessionFiles) generation() string {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return strconv.Itoa(sf.opened)
}

// removed tells whether the directory open as f was deleted (no links
// left; a staged clone shares its source's inode). One merely moved is
// still the session's: the session keeps the directory it was made with
// (see TestHostPathSwappedForSymlink).
func removed(f *os.File) bool {
	var st unix.Stat_t
	return unix.Fstat(int(f.Fd()), &st) != nil || st.Nlink == 0
}

// hostKey names a host directory's descriptor: the same directory mounted
// rw and ro needs two (only the rw clone is idmapped, and without root only
// an rw one is created for the sandbox user).
type hostKey struct {
	path  string
	owned bool
}

var errSessionClosed = errors.New("session is being stopped")

// network returns the session's network namespace, made (and attached to
// the egress proxy with info's policy) on first use. Only root can make
// one.
func (sf *sessionFiles) network(b *Backend, info backends.Session) (*os.File, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if err := sf.init(b); err != nil {
		return nil, err
	}
	if sf.net == nil {
		if sf.stage == "" {
			return nil, boxerr.BackendUnavailable("bwrap: a session with network needs boxrt to run as root (each session gets a network namespace of its own)")
		}
		pol, err := info.Network.Policy("network")
		if err != nil {
			return nil, err
		}
		n, err := b.makeNet(sf.stage, egress.Attachment{ID: info.SessionID, Policy: pol, Secrets: sf.secrets})
		if err != nil {
			if be := (*boxerr.Error)(nil); errors.As(err, &be) {
				return nil, err
			}
			return nil, boxerr.Failure("bwrap: the session's network: %v", err).Wrap(err)
		}
		sf.net = n
	}
	return sf.net.ns, nil
}

// cgroup returns the session's cgroup, <session dir>.<backend token>.s,
// made with the session's limits on its first exec (nil without cgroups).
// Every exec of the session is placed in it, so the limits bound the
// session's commands together, as a container's bound all its execs: one
// cgroup per session rather than per exec, because making and removing a
// cgroup (v1: in three hierarchies) cost more than the rest of an exec's
// own work. A session's limits do not change after it started.
func (sf *sessionFiles) cgroup(b *Backend, lim limits) (*cgroup, error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.closed {
		return nil, errSessionClosed
	}
	if sf.cg == nil && b.cg.version != cgroupNone {
		cg, err := b.cg.create(b.cfg.InstanceID, sf.key+"."+b.token+".s", lim)
		if err != nil {
			return nil, err
		}
		sf.cg = cg
	}
	return sf.cg, nil
}

// storage returns the session's workspace, tmp and home below its
// mounted disk (see disk.go), opened once.
func (sf *sessionFiles) storage(b *Backend, dir string) (ws, tmp, home *os.File, err error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if err := sf.init(b); err != nil {
		return nil, nil, nil, err
	}
	if sf.ws == nil {
		root, err := b.mountDisk(dir, sf)
		if err != nil {
			return nil, nil, nil, err
		}
		defer root.Close()
		var files [3]*os.File
		for i, name := range []string{workspaceDir, tmpDir, homeDir} {
			fd, _, err := openBeneath(int(root.Fd()), name, false, false, b.id)
			if err != nil {
				for _, f := range files[:i] {
					f.Close()
				}
				return nil, nil, nil, fmt.Errorf("open %s of session %s: %w", name, dir, err)
			}
			files[i] = os.NewFile(uintptr(fd), filepath.Join(root.Name(), name))
		}
		sf.ws, sf.tmp, sf.home = files[0], files[1], files[2]
	}
	return sf.ws, sf.tmp, sf.home, nil
}

// makeStorage creates the session's disk (StartSession).
func (sf *sessionFiles) makeStorage(b *Backend, dir string, info backends.Session) error {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if err := sf.init(b); err != nil {
		return err
	}
	return b.makeDisk(dir, sf, info)
}

// files returns the descriptor set of a session, making it on first use.
func (b *Backend) files(key string) *sessionFiles {
	b.mu.Lock()
	defer b.mu.Unlock()
	sf := b.open[key]
	if sf == nil {
		sf = &sessionFiles{key: key}
		b.open[key] = sf
	}
	return sf
}

// dropFiles closes a session's descriptors and detaches its stage
// (StopSession, once nothing of the session runs any more).
func (b *Backend) dropFiles(key string) error {
	b.mu.Lock()
	sf := b.open[key]
	delete(b.open, key)
	b.mu.Unlock()
	if sf == nil {
		// Not used by this process: a stage an earlier one left.
		sf = &sessionFiles{key: key, ready: true}
		if b.id.cred != nil {
			sf.stage = filepath.Join(stageRoot, b.cfg.InstanceID, key)
		}
	}
	return sf.close()
}

// mountParent is a directory bwrap binds that later mount points may lie
// in.
type mountParent struct {
	dst string
	dir *os.File
	rw  bool
}

// prepareMounts creates every mount point that lies inside another bound
// host directory (skills under the workspace, extra mounts under /home…)
// and the working directory, before bwrap runs. bwrap itself would create
// them by path, following whatever symlink a command planted there (a
// relative link into ../../oldroot/… is the host's root while bwrap builds
// the sandbox); here each component is opened or made below its parent's
// descriptor without following any symlink, given to the sandbox user,
// and a symlink in the way fails the start instead. Mount points in
// read-only directories are only checked: bwrap cannot create them either.
func prepareMounts(l layout, id identity) error {
	var parents []mountParent
	if l.tmp != nil {
		parents = append(parents, mountParent{"/tmp", l.tmp, true})
	}
	if l.home != nil {
		parents = append(parents, mountParent{"/home", l.home, true})
	}
	for _, m := range l.binds { // shallow first (layoutFor sorts them)
		if p, rel := deepestParent(parents, m.dst); p != nil && rel != "" {
			fd, _, err := openBeneath(int(p.dir.Fd()), rel, p.rw, true, id)
			switch {
			case err == nil:
				unix.Close(fd)
			case p.rw || err != unix.ENOENT:
				return boxerr.Failure("bwrap: mount point %s cannot be used: %v (a symlink or a file is in its path)", m.dst, err).Wrap(err)
			}
		}
		parents = append(parents, mountParent{m.dst, m.dir, !m.ro})
	}
	// bwrap's --chdir needs the working directory; a failure here is left
	// for bwrap to report.
	if p, rel := deepestParent(parents, l.workdir); p != nil && p.rw && rel != "" {
		if fd, _, err := openBeneath(int(p.dir.Fd()), rel, true, true, id); err == nil {
			unix.Close(fd)
		}
	}
	return nil
}

// deepestParent finds the mount that holds p inside the sandbox (the
// deepest; among equally deep ones the later, which bwrap mounts on top)
// and p's path relative to it ("" for the mount point itself).
func deepestParent(parents []mountParent, p string) (*mountParent, string) {
	var best *mountParent
	for i := range parents {
		m := &parents[i]
		if (p == m.dst || strings.HasPrefix(p, m.dst+"/")) && (best == nil || depth(m.dst) >= depth(best.dst)) {
			best = m
		}
	}
	if best == nil {
		return nil, ""
	}
	return best, strings.TrimPrefix(strings.TrimPrefix(p, best.dst), "/")
}
