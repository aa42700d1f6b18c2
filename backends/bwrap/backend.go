package bwrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/loopdisk"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// BackendName is the wire name of this backend.
const BackendName = "bwrap"

// Config configures a Backend.
type Config struct {
	// InstanceID is the stable id of this boxrt installation. Sessions and
	// cgroups are kept per instance id, and Adopt only ever returns (and
	// only ever cleans up after) this id. It must be 1-64 characters of
	// [A-Za-z0-9_.-] not starting with a dot.
	InstanceID string
	// StateDir holds sessions in <StateDir>/bwrap/<InstanceID>/<session dir>.
	StateDir string
	// BwrapPath is the bubblewrap binary; empty means "bwrap" from PATH.
	BwrapPath string
	// AgentBinary is the statically linked boxrt binary each session's
	// sandbox runs as its agent (`boxrt agent`), bound read-only at
	// /run/boxrt-agent/boxrt; the sandbox user must be able to read it.
	AgentBinary string
	// IdleRelease is how long a session's sandbox may stay idle (no call,
	// no user process in it) before it is stopped, to be started again by
	// the next call (idle.go); 0 keeps it running.
	IdleRelease time.Duration
	// Egress is boxrt's egress proxy: every session whose network is not
	// off gets a network namespace whose only way out it is (net.go).
	// nil: such sessions are refused.
	Egress *egress.Proxy
}

// Backend runs sessions as bubblewrap sandboxes. It is safe for concurrent
// use.
type Backend struct {
	cfg      Config
	bwrap    string
	bwrapErr error
	sh       string
	root     string // <StateDir>/bwrap/<InstanceID>
	cg       *cgroupManager
	userns   atomic.Bool
	id       identity // who bwrap runs as
	idErr    error
	// The loop-mounted per-session disk (disk.go): used when diskQuota.
	diskQuota bool
	mkfs      string
	noDiskWhy string
	pool      diskPool // default-size disks made ahead (diskpool.go)
	stageOnce sync.Once
	stageErr  error
	// starts bounds the sandboxes starting at once (resident.go).
	starts chan struct{}
	// launchNS is the mount namespace every sandbox's is copied from
	// (mountns.go).
	launchOnce sync.Once
	launchNS   int
	launchErr  error
	idmapOnce  sync.Once
	idmap      *os.File // see idmap.go
	idmapErr   error
	// unshare (util-linux) makes the network namespace of a session with
	// network (net.go).
	unshare string
	netErr  error
	// token makes this Backend's cgroup leaf names unique even for sessions
	// adopted from an earlier boxrt process (whose leaves may linger).
	token string
	// subreaper: boxrt adopts orphaned bwrap inits and reaps them (reap.go).
	subreaper bool

	mu       sync.Mutex
	sessions map[string]*sessionRuns  // by session directory name
	open     map[string]*sessionFiles // by session directory name
	creating backends.Creating        // session directories StartSession is making
	// adoptable: persistent sessions' sandboxes Adopt found still
	// running (persist.go), by session directory name.
	adoptable map[string]sandboxRecord

	// The idle sandboxes' release (idle.go).
	idleOnce           sync.Once
	idleStop, idleDone chan struct{}
}

// sessionRuns tracks the bwrap processes of one session, so StopSession can
// kill them and no new one starts while it does.
type sessionRuns struct {
	runs map[*run]struct{}
	// stopping counts the StopSession calls under way: one that gives up
	// (its ctx ended) must not reopen the session under another that is
	// still removing it.
	stopping int
}

var _ backends.Backend = (*Backend)(nil)

// New validates cfg and prepares the backend. It starts no sandbox; it
// looks up (as root, creates if missing) the sandbox user, reads a few
// /proc and cgroupfs files and tries boxrt's parent cgroup
// (kept, empty, on cgroup v2; removed again on v1) so Describe can report
// the enforced limits without I/O.
func New(cfg Config) (*Backend, error) {
	if !instanceIDRe.MatchString(cfg.InstanceID) {
		return nil, boxerr.Validation("instance_id",
			"bwrap: instance id %q must be 1-64 characters of [A-Za-z0-9_.-] not starting with a dot", cfg.InstanceID)
	}
	if strings.TrimSpace(cfg.StateDir) == "" {
		return nil, boxerr.Validation("state_dir", "bwrap: state directory must be set")
	}
	stateDir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, boxerr.Validation("state_dir", "bwrap: state directory %q: %v", cfg.StateDir, err).Wrap(err)
	}
	cfg.StateDir = stateDir
	b := &Backend{
		cfg:      cfg,
		root:     filepath.Join(stateDir, "bwrap", cfg.InstanceID),
		sessions: map[string]*sessionRuns{},
		open:     map[string]*sessionFiles{},
		token:    randomHex(4),
		starts:   make(chan struct{}, max(4, 2*runtime.NumCPU())),
	}
	b.id, b.idErr = sandboxIdentity()
	b.unshare, b.netErr = loopdisk.LookSbin("unshare")
	if b.netErr == nil && cfg.Egress == nil {
		b.netErr = errors.New("no egress proxy configured")
	}
	b.mkfs, b.noDiskWhy = loopdisk.Tools()
	b.diskQuota = b.noDiskWhy == ""
	name := cfg.BwrapPath
	if name == "" {
		name = "bwrap"
	}
	if b.bwrap, b.bwrapErr = exec.LookPath(name); b.bwrapErr == nil {
		b.bwrap, _ = filepath.Abs(b.bwrap)
	}
	if b.sh, err = exec.LookPath("/bin/sh"); err != nil {
		b.sh = "/bin/sh"
	}
	// A user namespace of our own is what lets --disable-userns work; a
	// kernel with user namespaces switched off (even for root) cannot give
	// us one. Probe refines this by trying.
	b.userns.Store(exists("/proc/self/ns/user") && strings.TrimSpace(readString("/proc/sys/user/max_user_namespaces")) != "0")
	b.cg = detectCgroups(cfg.InstanceID)
	b.subreaper = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == nil
	return b, nil
}

func readString(path string) string {
	data, _ := os.ReadFile(path)
	return string(data)
}

// Name implements backends.Backend.
func (b *Backend) Name() string { return BackendName }

// DefaultImage implements backends.Backend: the host's system directories.
func (b *Backend) DefaultImage() string { return HostImage }

// Describe implements backends.Backend.
func (b *Backend) Describe() backends.Description {
	notes := slices.Clone(b.cg.notes)
	if slices.Contains(b.cg.controllers, "memory") && !b.cg.swapLimited {
		notes = append(notes, "swap accounting is off: the memory limit does not cap swap use")
	}
	notes = append(notes,
		"each session is one resident bwrap sandbox (new user, pid, ipc, uts, mount and cgroup namespaces, no capabilities) whose agent starts the session's execs and managed processes: they share its pid namespace and loopback, and what one command leaves running is there for the next; a persistent session's sandbox outlives boxrt and is adopted by the next boxrt on the same state directory, others end with boxrt",
		"read_only_rootfs is always in effect: the root is the host's system directories (or the image rootfs) bound read-only; only the workspace, rw mounts, /tmp and /home are writable",
		"commands run as uid 0 without capabilities inside a user namespace of their own; on the host that is the unprivileged user "+b.sandboxUserName()+", never root",
		"a session with network (on or a policy) gets a network namespace of its own whose only way out is boxrt's egress proxy (public addresses only with on; the policy's hosts otherwise); off gives an empty one",
	)
	if b.cfg.IdleRelease > 0 && b.cg.version != cgroupNone {
		notes = append(notes, fmt.Sprintf("a session's sandbox with no call and none of its processes running for %s is stopped (files kept) and started again by the next call", b.cfg.IdleRelease))
	}
	notes = append(notes,
		"a seccomp filter denies what Docker's default profile denies (io_uring, keyrings, bpf, perf, userfaultfd, mount, namespace changes, ptrace, module and kexec loading…) and every syscall of another ABI",
	)
	if b.diskQuota {
		notes = append(notes, fmt.Sprintf("the workspace, /tmp and /home share a per-session ext4 disk of workspace_quota_mb MiB (%d when 0); a host_path workspace is not counted", DefaultQuotaMB))
	} else {
		notes = append(notes, "workspace_quota_mb is not enforced ("+b.noDiskWhy+"): the workspace, /tmp and /home are plain directories on the host disk")
	}
	return backends.Description{
		EnforcedLimits: b.cg.enforcedLimits(),
		Isolation:      "namespaces (bubblewrap)",
		SkillsLive:     true,
		Notes:          notes,
	}
}

// sandboxUserName names the host user sandboxes run as.
func (b *Backend) sandboxUserName() string {
	if b.id.cred == nil {
		return fmt.Sprintf("uid %d (boxrt's own)", b.id.uid)
	}
	return fmt.Sprintf("%s (uid %d)", SandboxUser, b.id.uid)
}

func (b *Backend) netUnavailable() error {
	return boxerr.BackendUnavailable(
		"bwrap: a session with network needs unshare and boxrt's egress proxy (%v); install unshare with: apt-get install util-linux", b.netErr).Wrap(b.netErr)
}

func (b *Backend) idUnavailable() error {
	return boxerr.BackendUnavailable("bwrap: %v", b.idErr).Wrap(b.idErr)
}

// prepareRoot creates the instance directory.
func (b *Backend) prepareRoot() error {
	if err := os.MkdirAll(b.root, 0o700); err != nil {
		return boxerr.BackendUnavailable("bwrap state directory %s cannot be created: %v", b.root, err).Wrap(err)
	}
	return nil
}

// unavailable is the error for a missing bwrap binary.
func (b *Backend) unavailable() error {
	return boxerr.BackendUnavailable(
		"bubblewrap is not installed (%v); install it with: apt-get install bubblewrap", b.bwrapErr).Wrap(b.bwrapErr)
}

// Probe implements backends.Backend: bwrap exists, the state directory is
// writable and a trivial sandbox runs.
func (b *Backend) Probe(ctx context.Context) error {
	if b.bwrapErr != nil {
		return b.unavailable()
	}
	if b.idErr != nil {
		return b.idUnavailable()
	}
	if err := b.prepareRoot(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	l := layout{userns: true, workdir: "/"}
	out, err := b.dryRun(ctx, l)
	if err == nil {
		b.userns.Store(true)
		return nil
	}
	if ctx.Err() == nil {
		// Root on a kernel without user namespaces can still sandbox, only
		// without --disable-userns.
		l.userns = false
		if _, err2 := b.dryRun(ctx, l); err2 == nil {
			b.userns.Store(false)
			return nil
		}
	}
	hint := "check that the kernel allows namespaces"
	if os.Geteuid() != 0 {
		hint = "boxrt is not root, so bwrap needs unprivileged user namespaces: enable them " +
			"(sysctl -w kernel.unprivileged_userns_clone=1 on Debian, user.max_user_namespaces > 0, " +
			"and on Ubuntu 24.04+ kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap), or run boxrt as root"
	}
	return boxerr.BackendUnavailable("bubblewrap (%s) cannot start a sandbox: %s; %s", b.bwrap, oneLine(out, err), hint).Wrap(err)
}

// dryRun runs `/bin/sh -c true` in a sandbox with the given layout, without
// cgroups, and returns bwrap's output on failure.
func (b *Backend) dryRun(ctx context.Context, l layout) (string, error) {
	fds := &fdList{next: b.fdBase()}
	defer fds.close()
	args, err := bwrapArgs(l, fds)
	if err != nil {
		return "", err
	}
	args, infoR, infoW, err := b.withInfoFd(args, fds)
	if err != nil {
		return "", err
	}
	if infoR != nil {
		defer infoR.Close()
		defer infoW.Close()
	}
	f, err := argsFile(args)
	if err != nil {
		return "", err
	}
	defer f.Close()
	cmd := b.bwrapCmd(ctx, f, fds, []string{"/bin/sh", "-c", "true"})
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if l.netns != nil {
		err = b.startOnThread(placement{netns: l.netns}, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err == nil {
		init := -1
		if infoR != nil {
			infoW.Close()
			init = initPidfd(infoR, cmd.Process.Pid)
		}
		err = cmd.Wait()
		reapInit(init)
	}
	return out.String(), err
}

func oneLine(out string, err error) string {
	s := strings.Join(strings.Fields(out), " ")
	if len(s) > 300 {
		s = s[:297] + "..."
	}
	if s == "" && err != nil {
		s = err.Error()
	} else if err != nil {
		s += " (" + err.Error() + ")"
	}
	return s
}

// StartSession implements backends.Backend: it creates the session's state
// directory and disk, and, when the session brings directories of the
// caller's (a rootfs image, host_path, extra mounts), checks with a dry run
// that bwrap can build its sandbox, so a bad mount or image fails here
// rather than on every exec. Without such directories the sandbox is the
// one Probe built plus the session's own disk, made by boxrt just now: a
// dry run would cost as much as the first exec and tell nothing new.
func (b *Backend) StartSession(ctx context.Context, spec backends.SandboxSpec) (backends.Session, error) {
	if spec.SessionID == "" {
		return backends.Session{}, boxerr.Validation("session_id", "session_id must not be empty")
	}
	if _, err := resolveImage(spec.Image, true); err != nil {
		return backends.Session{}, err
	}
	if b.bwrapErr != nil {
		return backends.Session{}, b.unavailable()
	}
	if _, err := backends.CheckMountPath("mount_path", spec.MountPath); err != nil {
		return backends.Session{}, err
	}
	for i, m := range spec.ActiveExtraMounts() {
		if _, err := backends.CheckMountPath(fmt.Sprintf("extra_mounts[%d].mount_path", i), m.MountPath); err != nil {
			return backends.Session{}, err
		}
	}
	if b.idErr != nil {
		return backends.Session{}, b.idUnavailable()
	}
	if spec.Network.Egress() && b.netErr != nil {
		return backends.Session{}, b.netUnavailable()
	}
	if err := ctx.Err(); err != nil {
		return backends.Session{}, err
	}
	if err := b.prepareRoot(); err != nil {
		return backends.Session{}, err
	}
	var name, dir string
	for attempt := 0; ; attempt++ {
		name = newSessionDirName(spec.SessionID)
		dir = filepath.Join(b.root, name)
		done := b.creating.Begin(name)
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			defer done()
			break
		}
		done()
		if !errors.Is(err, fs.ErrExist) || attempt == 5 {
			return backends.Session{}, backends.StateDirError(fmt.Sprintf("bwrap: cannot create session directory %s", dir), err)
		}
	}
	info := spec.Session(BackendName, name)
	if err := b.populate(dir, name, info); err != nil {
		b.discard(name, dir)
		return backends.Session{}, backends.StateDirError(fmt.Sprintf("bwrap: cannot prepare session directory %s", dir), err)
	}
	// Host directories are opened (and created like `docker run -v` does,
	// for ro mounts too) here, once for the session's lifetime.
	sf := b.files(name)
	sf.mu.Lock()
	sf.secrets = spec.Secrets
	sf.mu.Unlock()
	l, err := b.layoutFor(sf, dir, info, "/", nil)
	if err == nil {
		err = prepareMounts(l, b.id)
	}
	if err == nil {
		// The session is its resident sandbox, started here: a session
		// that cannot run fails at create, and its first command only
		// enters it.
		_, err = b.sandbox(ctx, dir, info)
		b.files(name).res.leave()
	}
	if err != nil {
		b.discard(name, dir)
		if ctx.Err() != nil {
			return backends.Session{}, ctx.Err()
		}
		return backends.Session{}, err
	}
	return info, nil
}

// populate makes the session's storage and records the session.
func (b *Backend) populate(dir, key string, info backends.Session) error {
	if err := b.files(key).makeStorage(b, dir, info); err != nil {
		return err
	}
	saved := info
	saved.CreatedAt = time.Now().UTC()
	return writeState(dir, stateFile{Format: stateFormat, InstanceID: b.cfg.InstanceID, Session: saved})
}

// discard removes everything of a session: its descriptors, its stage
// with the disk mount (and with it the loop device) and its directory.
func (b *Backend) discard(key, dir string) error {
	if err := b.dropFiles(key); err != nil {
		return err
	}
	return removeTree(dir)
}

// sessionDir maps a Session to its state directory, refusing ids that
// are not of our making (they are joined to a path).
func (b *Backend) sessionDir(info backends.Session) (string, bool) {
	if !sessionDirRe.MatchString(info.BackendSessionID) {
		return "", false
	}
	return filepath.Join(b.root, info.BackendSessionID), true
}

func (b *Backend) lookup(info backends.Session) (string, error) {
	dir, ok := b.sessionDir(info)
	if !ok {
		return "", boxerr.SessionNotFound(info.SessionID)
	}
	if _, err := os.Stat(filepath.Join(dir, sessionFile)); err != nil {
		return "", boxerr.SessionNotFound(info.SessionID)
	}
	return dir, nil
}

// Alive implements backends.Backend: a bwrap session is alive while its
// state directory exists (its sandbox is started again when it is gone).
func (b *Backend) Alive(_ context.Context, info backends.Session) bool {
	_, err := b.lookup(info)
	return err == nil
}

// Existing implements backends.Census: the session directories that hold
// their session.json, as Alive sees them; a read of one directory and a
// stat per session, no process is asked.
func (b *Backend) Existing(context.Context) (map[string]bool, error) {
	entries, err := os.ReadDir(b.root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, boxerr.Failure("bwrap: cannot read %s: %v", b.root, err).Wrap(err)
	}
	out := make(map[string]bool, len(entries))
	for _, e := range entries {
		if !e.IsDir() || !sessionDirRe.MatchString(e.Name()) {
			continue
		}
		if _, err := os.Stat(filepath.Join(b.root, e.Name(), sessionFile)); err == nil {
			out[e.Name()] = true
		}
	}
	return out, nil
}

// StopSession implements backends.Backend: kill what still runs for the
// session, remove its cgroups and its state directory. Idempotent. When ctx
// ends before the killed commands are gone, it returns ctx's error and the
// session stays, usable, for a later StopSession to remove.
func (b *Backend) StopSession(ctx context.Context, info backends.Session) error {
	dir, ok := b.sessionDir(info)
	if !ok {
		return nil // not an id of ours: nothing of ours to stop
	}
	key := info.BackendSessionID
	release, err := b.quiesce(ctx, key)
	defer release()
	if err != nil {
		return err
	}
	if err := b.discard(key, dir); err != nil {
		return boxerr.Failure("bwrap: cannot remove session %s: %v", dir, err).Wrap(err)
	}
	return nil
}

// quiesce kills every run of the session under key and waits for them to
// end; until release is called no new run may start. Leaves of processes
// this Backend does not track (left by an earlier boxrt process of the same
// installation) are removed too. release must be called even on error.
func (b *Backend) quiesce(ctx context.Context, key string) (release func(), _ error) {
	b.mu.Lock()
	sr := b.sessions[key]
	if sr == nil {
		sr = &sessionRuns{runs: map[*run]struct{}{}}
		b.sessions[key] = sr
	}
	sr.stopping++
	runs := make([]*run, 0, len(sr.runs))
	for r := range sr.runs {
		runs = append(runs, r)
	}
	b.mu.Unlock()
	// Whether the stop finished or its ctx ended first, this call no longer
	// holds the session closed. A stop that gave up leaves a session whose
	// directory still exists, which Alive reports alive: it must take execs
	// again (its running commands were killed all the same), else it would
	// refuse every one until a second stop. One that finished removed the
	// directory, which register checks, so nothing starts after it either.
	release = func() {
		b.mu.Lock()
		sr.stopping--
		if b.sessions[key] == sr && sr.stopping == 0 && len(sr.runs) == 0 {
			delete(b.sessions, key)
		}
		b.mu.Unlock()
	}

	b.killUnadopted(key)
	for _, r := range runs {
		r.markStopped()
		r.kill()
	}
	for _, r := range runs {
		select {
		case <-r.done:
		case <-ctx.Done():
			return release, ctx.Err()
		}
	}
	for _, leaf := range b.cg.leaves(b.cfg.InstanceID) {
		if strings.HasPrefix(leaf, key+".") {
			b.cg.existing(b.cfg.InstanceID, leaf).remove()
		}
	}
	return release, nil
}

// Adopt implements backends.Backend: every session.json under our own
// instance directory, and nothing else. A session directory without one is
// what an earlier process was killed while making (or removing): it is
// removed with its stage. It also removes cgroups an earlier boxrt process
// of this installation left behind (their processes died with it through
// --die-with-parent; anything still inside is killed).
func (b *Backend) Adopt(ctx context.Context) ([]backends.Session, error) {
	entries, err := os.ReadDir(b.root)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, boxerr.Failure("bwrap: cannot read %s: %v", b.root, err).Wrap(err)
	}
	out := []backends.Session{}
	keep := map[string]bool{} // cgroup leaves of running sandboxes
	var halfMade []error
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.IsDir() || !sessionDirRe.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(b.root, e.Name())
		st, err := readState(dir)
		if errors.Is(err, fs.ErrNotExist) && !b.creating.Has(e.Name()) {
			// No session.json: a creation (or a removal) an earlier
			// process was killed in the middle of. Nobody was told of
			// this session; its storage and stage go.
			if err := b.discard(e.Name(), dir); err != nil {
				halfMade = append(halfMade, err)
			}
			continue
		}
		if err != nil || st.InstanceID != b.cfg.InstanceID ||
			st.Session.BackendName != BackendName || st.Session.BackendSessionID != e.Name() {
			continue
		}
		info := st.Session
		if st.Sandbox != nil && info.Persistent && st.Sandbox.alive() {
			b.setAdoptable(e.Name(), *st.Sandbox)
			keep[st.Sandbox.Leaf] = true
		}
		if fi, err := os.Stat(filepath.Join(dir, sessionFile)); err == nil {
			info.LastUsedAt = fi.ModTime().UTC()
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, c backends.Session) int { return a.CreatedAt.Compare(c.CreatedAt) })

	b.removeStalePools()
	// Leaves carry the token of the Backend that made them; any other
	// token is a previous boxrt process of this installation.
	for _, leaf := range b.cg.leaves(b.cfg.InstanceID) {
		if !strings.Contains(leaf, "."+b.token+".") && !keep[leaf] {
			b.cg.existing(b.cfg.InstanceID, leaf).remove()
		}
	}
	if len(halfMade) > 0 {
		err := errors.Join(halfMade...)
		return out, boxerr.Failure("bwrap: cannot remove half-made sessions: %v", err).Wrap(err)
	}
	return out, nil
}

// MeasureIsolation measures this backend's isolation by probing a real
// sandbox of each level it offers (backends.MeasureIsolation).
func (b *Backend) MeasureIsolation(ctx context.Context) []backends.IsolationReport {
	return backends.MeasureIsolation(ctx, b)
}
