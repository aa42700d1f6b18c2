package bwrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// Where the resident sandbox sees the agent: its binary and the directory
// of its socket, both bound read-only.
const (
	agentMountDir = "/run/boxrt-agent"
	agentBinPath  = agentMountDir + "/boxrt"
	agentSockDir  = agentMountDir + "/sock"
	// agentHostDir is the socket's directory in the session's stage (as
	// root) or state directory; agentHostBin the agent binary's mount in
	// the stage.
	agentHostDir = "agent"
	agentHostBin = "agent-bin"
)

const (
	// acceptTimeout bounds a sandbox's start: bwrap building it, the agent
	// starting and saying hello.
	acceptTimeout = 15 * time.Second
	// killGrace is how long a command asked to die (SIGKILL to its process
	// group, through the agent) may take before the host kills the whole
	// sandbox.
	killGrace = 2 * time.Second
)

// resident is a session's resident sandbox: one bwrap whose command is the
// agent (sandboxagent), which starts every exec and managed process of the
// session inside it. It is started on first use and started again when it
// was lost (its agent died or broke the protocol, or the host killed it).
type resident struct {
	mu     sync.Mutex
	ln     *sandboxagent.Listener
	r      *run
	conn   *sandboxagent.Conn
	mounts string // the mounts it was started with (mountsKey)
	// persist: the sandbox outlives boxrt (persist.go); Close detaches
	// from it instead of killing it.
	persist bool
	// busyAt is when the sandbox was last handed to a call or seen with
	// a user process (idle.go).
	busyAt time.Time
	// entering counts the calls sandbox handed it to that have not yet
	// started their process (leave): it is not idle meanwhile, however
	// long a loaded machine takes to start it.
	entering int
	// pooled: the session waits in a warm pool, whose point is a running
	// sandbox; it is not released when idle.
	pooled bool
}

// machine is what one call uses of a session's resident sandbox.
type machine struct {
	r    *run
	conn *sandboxagent.Conn
	// restarted: this call started the sandbox afresh because the previous
	// one was lost or its mounts changed.
	restarted bool
}

// alive reports whether the sandbox and its agent's connection are up.
func (m *machine) alive() bool {
	select {
	case <-m.conn.Done():
		return false
	case <-m.r.done:
		return false
	default:
		return true
	}
}

// hostKill ends the whole sandbox from the host (its pid namespace init)
// and drops the agent's connection, so every Wait pending on it returns.
func (m *machine) hostKill() {
	m.r.kill()
	_ = m.conn.Close()
}

// mountsKey is what of a session's spec decides its sandbox's mounts (and
// whether it has a network namespace; its policy changes live): a
// change (a new skill, say) needs a new sandbox, as does a host directory
// opened afresh (sessionFiles.generation).
func mountsKey(info backends.Session) string {
	data, _ := json.Marshal([]any{info.Image, info.HostPath, info.HostPathMode, info.MountPathOrDefault(), info.ExtraMounts, info.Network.Egress()})
	return string(data)
}

// sandbox returns the session's resident sandbox, starting it when there
// is none, it was lost, or the session's mounts changed. The caller
// calls res.leave once its process is started (or it gave up), whether
// sandbox failed or not.
func (b *Backend) sandbox(ctx context.Context, dir string, info backends.Session) (*machine, error) {
	sf := b.files(info.BackendSessionID)
	res := &sf.res
	res.mu.Lock()
	defer res.mu.Unlock()
	res.entering++
	key := mountsKey(info) + sf.generation()
	res.busyAt = time.Now()
	res.pooled = strings.HasPrefix(info.SessionID, backends.PoolSessionPrefix)
	restarted := false
	if rec := sf.takeAdopted(); rec != nil && res.conn == nil {
		m, err := b.adoptResident(ctx, sf, dir, info, *rec)
		if err == nil {
			res.r, res.conn, res.mounts, res.persist = m.r, m.conn, key, true
			b.startIdleLoop()
			return m, nil
		}
		// Its processes are gone (or it was killed just now): a fresh
		// sandbox, which says so.
		restarted = true
	}
	if res.conn != nil {
		m := &machine{r: res.r, conn: res.conn}
		// A run a stop killed (one that then gave up: its ctx ended) may
		// not have been reaped yet, and its agent's connection not seen
		// to drop: it is never entered again.
		if m.alive() && !m.r.wasStopped() && res.mounts == key {
			return m, nil
		}
		restarted = true
		m.hostKill()
		<-m.r.done
		res.r, res.conn = nil, nil
		res.dropListener()
	}
	m, err := b.startResident(ctx, sf, dir, info, info.Persistent)
	if err != nil {
		return nil, err
	}
	m.restarted = restarted
	res.r, res.conn, res.mounts = m.r, m.conn, key
	return m, nil
}

// startResident starts the session's sandbox with the agent as its
// command and waits for the agent's hello; persist: one that outlives
// boxrt (persist.go). res.mu is held.
func (b *Backend) startResident(ctx context.Context, sf *sessionFiles, dir string, info backends.Session, persist bool) (*machine, error) {
	if b.cfg.AgentBinary == "" {
		return nil, boxerr.BackendUnavailable("bwrap: no agent binary configured (Config.AgentBinary)")
	}
	sockDir, bin, err := sf.agentFiles(b, dir)
	if err != nil {
		return nil, boxerr.Failure("bwrap: the session agent's files: %v", err).Wrap(err)
	}
	res := &sf.res
	if res.ln == nil {
		if res.ln, err = sandboxagent.Listen(sockDir); err != nil {
			return nil, boxerr.Failure("bwrap: the agent's socket: %v", err).Wrap(err)
		}
	}
	// A burst of starts (a burst of calls on sessions whose idle sandboxes
	// were released) would otherwise share the CPU until all of them miss
	// acceptTimeout; in turn, each start is quick. The wait is the
	// caller's, bounded by its context.
	select {
	case b.starts <- struct{}{}:
		defer func() { <-b.starts }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// bwrap's and the agent's own output go to a memory file rather than
	// a pipe to boxrt, which a sandbox outliving boxrt would write into
	// broken.
	out, err := memFile("boxrt-sandbox-output", nil)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	r, err := b.start(launch{
		sessionID: info.SessionID,
		key:       info.BackendSessionID,
		dir:       dir,
		info:      info,
		workdir:   "/",
		argv:      []string{agentBinPath, "agent", "--connect", agentSockDir + "/" + sandboxagent.SocketName},
		lim:       limitsOf(info, 0),
		agent:     &agentMounts{bin: bin, sock: sockDir},
		persist:   persist,
		stdout:    out,
		stderr:    out,
	})
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, acceptTimeout)
	defer cancel()
	go func() {
		select {
		case <-r.done: // bwrap failed: nobody will dial
			cancel()
		case <-actx.Done():
		}
	}()
	conn, err := res.ln.Accept(actx)
	if err != nil {
		r.kill()
		<-r.done
		res.dropListener()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		msg := make([]byte, 2048)
		n, _ := out.ReadAt(msg, 0)
		return nil, boxerr.Failure("bwrap: the sandbox of session %s did not start: %s", info.SessionID, oneLine(string(msg[:n]), err)).Wrap(err)
	}
	if persist && b.recordSandbox(dir, r, sf) != nil {
		// A state directory that cannot record it (full, say) would leave
		// a sandbox nobody adopts: one that ends with boxrt instead.
		r.kill()
		<-r.done
		_ = conn.Close()
		res.dropListener()
		return b.startResident(ctx, sf, dir, info, false)
	}
	res.persist = persist
	b.startIdleLoop()
	return &machine{r: r, conn: conn}, nil
}

// agentMounts are the host side of the agent's binds.
type agentMounts struct {
	bin, sock string
}

// agentFiles makes the directory of the session's agent socket and
// returns it with the agent binary to bind. As root both are in the
// session's stage (which the sandbox user may traverse): the binary is
// mounted there read-only from Config.AgentBinary, wherever that lies.
// Otherwise the socket is in the session's state directory (the sandbox
// user's own) and the binary is bound from its path.
func (sf *sessionFiles) agentFiles(b *Backend, dir string) (sock, bin string, err error) {
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if err := sf.init(b); err != nil {
		return "", "", err
	}
	base, bin := dir, b.cfg.AgentBinary
	if sf.stage != "" {
		base, bin = sf.stage, filepath.Join(sf.stage, agentHostBin)
		if !sf.agentStaged {
			if err := stageFile(b.cfg.AgentBinary, bin); err != nil {
				return "", "", err
			}
			sf.agentStaged = true
		}
	}
	sock = filepath.Join(base, agentHostDir)
	if err := os.Mkdir(sock, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", "", err
	}
	return sock, bin, nil
}

// stageFile mounts a read-only clone of the file at src on target (made).
func stageFile(src, target string) error {
	fd, err := unix.Open(src, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("set the attributes of the clone of %s: %w", src, err)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach %s at %s: %w", src, target, err)
	}
	return nil
}

// dropListener closes the socket, so that the next sandbox gets a fresh
// one: a connection queued on this one (an agent of the sandbox just
// killed, which dialled again after its connection dropped, hello already
// sent) must never be taken for the new sandbox's agent. Every process of
// the old sandbox is gone by now (run.kill waits for its pid namespace), so
// only the new sandbox can dial the new socket. res.mu is held.
func (res *resident) dropListener() {
	if res.ln != nil {
		_ = res.ln.Close()
		res.ln = nil
	}
}

// closeOrDetach is close, except that a persistent session's sandbox is
// left running, for a later boxrt to adopt; detached reports that.
func (res *resident) closeOrDetach() (detached bool) {
	res.mu.Lock()
	detached = res.persist && res.conn != nil
	if detached {
		_ = res.conn.Close()
		res.r, res.conn = nil, nil
		res.dropListener()
	}
	res.mu.Unlock()
	if !detached {
		res.close()
	}
	return detached
}

// close ends the sandbox (if still running) and removes the socket.
func (res *resident) close() {
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.conn != nil {
		m := &machine{r: res.r, conn: res.conn}
		m.hostKill()
		<-m.r.done
		res.r, res.conn = nil, nil
	}
	res.dropListener()
}

// leave ends a call's entering (sandbox): the sandbox counts as busy
// until now.
func (res *resident) leave() {
	res.mu.Lock()
	res.entering--
	res.busyAt = time.Now()
	res.mu.Unlock()
}

// spawn starts the process prepare describes for the sandbox it is given
// in the session's sandbox. A sandbox found lost at this point (its agent
// gone since sandbox returned it) is started again once.
func (b *Backend) spawn(ctx context.Context, dir string, info backends.Session, prepare func(*machine) (sandboxagent.SpawnRequest, error)) (*machine, *sandboxagent.Proc, error) {
	restarted := false
	for attempt := 0; ; attempt++ {
		m, p, err := b.enter(ctx, dir, info, prepare)
		if err == nil {
			m.restarted = m.restarted || restarted
			return m, p, nil
		}
		if m == nil {
			return nil, nil, err
		}
		var se *sandboxagent.SpawnError
		switch {
		case errors.As(err, &se):
			return nil, nil, boxerr.Failure("bwrap: %v", err).Wrap(err)
		case m.r.wasStopped():
			return nil, nil, boxerr.SessionNotFound(info.SessionID)
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		case attempt > 0:
			return nil, nil, boxerr.Failure("bwrap: the sandbox's agent: %v", err).Wrap(err)
		}
		// Lost or misbehaving: the next sandbox call replaces it.
		m.hostKill()
		restarted = true
	}
}

// enter spawns prepare's process in the session's sandbox once: m is nil
// when no sandbox was there to try it in.
func (b *Backend) enter(ctx context.Context, dir string, info backends.Session, prepare func(*machine) (sandboxagent.SpawnRequest, error)) (*machine, *sandboxagent.Proc, error) {
	defer b.files(info.BackendSessionID).res.leave()
	m, err := b.sandbox(ctx, dir, info)
	if err != nil {
		return nil, nil, err
	}
	req, err := prepare(m)
	if err != nil {
		return nil, nil, err
	}
	p, err := m.conn.Spawn(ctx, req)
	return m, p, err
}

// exitOf waits for p's exit. An exit the agent could not report (the
// sandbox was lost, or it broke the protocol) reads as a SIGKILL: the
// sandbox, and the process with it, is gone or about to be killed.
func exitOf(p *sandboxagent.Proc) sandboxagent.Exit {
	e, err := p.Wait(context.Background())
	if err != nil {
		e = sandboxagent.Exit{Code: 128 + int(syscall.SIGKILL), Signal: int(syscall.SIGKILL)}
	}
	return e
}

// end kills p's process tree: its process group through the agent, and
// from the host every process below it, those that left its group with
// setsid included. If p has not exited within killGrace (a hostile or dead
// agent), the whole sandbox is killed from the host: hostKilled then says
// so.
func (m *machine) end(p *sandboxagent.Proc) (_ sandboxagent.Exit, hostKilled bool) {
	tree := m.treeOf(p.PID())
	_ = p.Signal(syscall.SIGKILL)
	for _, pid := range tree {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-p.Done():
		return exitOf(p), false
	case <-t.C:
	}
	m.hostKill()
	return exitOf(p), true
}

// treeOf lists the host pids of the sandbox's process nsPid (the agent's
// word, looked for among the sandbox's own processes only) and of every
// process below it. One that was orphaned (its parent exited) hangs below
// the agent by then and is not found.
func (m *machine) treeOf(nsPid int) []int {
	m.r.mu.Lock()
	sandbox := m.r.cmd.Process.Pid
	m.r.mu.Unlock()
	for _, pid := range descendants(sandbox) {
		if nsPidOf(pid) == nsPid {
			return append(descendants(pid), pid)
		}
	}
	return nil
}
