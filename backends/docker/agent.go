package docker

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/sandboxagent"
)

// LabelAgent marks a container whose entrypoint is the session agent; a
// container without it (gVisor, a remote engine, an older boxrt's) is
// served through Engine execs.
const LabelAgent = "boxrt.agent"

// Where the agent's binary and its socket directory are bound in the
// container: outside every path a session uses, read-only both.
const (
	agentBinaryPath = "/run/boxrt-agent/boxrt"
	agentSockDir    = "/run/boxrt-agent/sock"
)

const (
	// agentConnectTimeout bounds the wait for a container's agent to
	// connect: after a start (the engine's start, then the agent's exec)
	// or a boxrt restart (the agent re-dials at least once a second).
	agentConnectTimeout = 15 * time.Second
	// maxAgentEnv bounds the environment read from the container's PID 1.
	maxAgentEnv = 64 << 10
)

// agentEntrypoint runs the agent as the container's PID 1 (no engine
// init): it reaps every process of the container.
var agentEntrypoint = []string{agentBinaryPath, "agent", "--connect", agentSockDir + "/" + sandboxagent.SocketName}

// agentBinary resolves Config.AgentBinary. A dynamically linked binary
// (a boxrt built with cgo) cannot run in an arbitrary image: it is not
// used, and off says why.
func agentBinary(path string) (resolved, off string, err error) {
	path = strings.TrimSpace(path)
	if path == "" {
		return "", "", nil
	}
	if resolved, err = filepath.EvalSymlinks(path); err != nil {
		return "", "", boxerr.Validation("agent_binary", "docker backend: agent binary %s: %v", path, err)
	}
	f, err := elf.Open(resolved)
	if err != nil {
		return "", "", boxerr.Validation("agent_binary", "docker backend: agent binary %s is not an executable: %v", resolved, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", resolved + " is dynamically linked (build boxrt with CGO_ENABLED=0)", nil
		}
	}
	return resolved, "", nil
}

// usesAgent says whether a new session of sb runs its commands through
// the agent. The agent's socket is a host path, so the engine must be on
// this host; under gVisor the runtime must be registered to let the
// sandbox reach a host socket (gvisorAgentOff).
func (b *Backend) usesAgent(ctx context.Context, sb backends.Sandbox) (bool, error) {
	if b.agentBinary == "" || b.stateDir == "" || !b.localEngine() {
		return false, nil
	}
	if !b.OnGVisor(sb) {
		return true, nil
	}
	off, err := b.gvisorAgentOff(ctx, b.runtimeFor(sb))
	return off == "", err
}

// UsesAgent tells whether a new session of sb runs its commands through
// the session agent rather than Engine execs (Describe's notes say why
// not).
func (b *Backend) UsesAgent(ctx context.Context, sb backends.Sandbox) (bool, error) {
	return b.usesAgent(ctx, sb)
}

// agentDir is container name's socket directory on the host.
func (b *Backend) agentDir(name string) string {
	return filepath.Join(b.stateDir, "docker", b.instance, "agent", name)
}

// agentMounts are the binds of the agent's binary and socket directory,
// the directory made (and emptied of a stale socket) first.
func (b *Backend) agentMounts(name string) ([]mount.Mount, error) {
	dir := b.agentDir(name)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, boxerr.Failure("docker backend: making the agent directory of %s: %v", name, err).Wrap(err)
	}
	// 0755: the sandbox user must reach the socket in it.
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, boxerr.Failure("docker backend: making the agent directory of %s: %v", name, err).Wrap(err)
	}
	return []mount.Mount{
		{Type: mount.TypeBind, Source: b.agentBinary, Target: agentBinaryPath, ReadOnly: true},
		{Type: mount.TypeBind, Source: dir, Target: agentSockDir, ReadOnly: true},
	}, nil
}

// agentLink is boxrt's side of one container's agent: its listening
// socket and, once the agent has dialled, its connection.
type agentLink struct {
	b    *Backend
	name string
	dir  string // the socket's directory on the host

	mu   sync.Mutex // held while connecting or restarting
	info backends.Session
	ln   *sandboxagent.Listener
	conn *sandboxagent.Conn // nil until the agent connected (again)
	env  []string           // the environment of the container's PID 1
	// pid is the agent's host pid, checked at accept to be the
	// container's first process; 0 when it cannot be (gVisor).
	pid int
	// restarted: the container was restarted since an exec last said so.
	restarted bool
}

// noAgent is what Backend.links holds for a container served through
// Engine execs.
type noAgentT struct{}

var noAgent = noAgentT{}

// link returns container name's agentLink, nil for a container without an
// agent. A container this Backend has not seen yet (made by an earlier
// boxrt and not adopted) is looked up once.
func (b *Backend) link(ctx context.Context, info backends.Session) (*agentLink, error) {
	name := info.BackendSessionID
	if v, ok := b.links.Load(name); ok {
		l, _ := v.(*agentLink)
		return l, nil
	}
	c, err := b.cli.ContainerInspect(ctx, name)
	if err != nil {
		return nil, b.sessionError(info, "inspecting container "+name, err)
	}
	dir := agentDirOf(c.Mounts)
	agent, err := b.usesAgent(ctx, info.Sandbox)
	if err != nil {
		return nil, err
	}
	if c.Config == nil || c.Config.Labels[LabelAgent] != "1" || dir == "" || !agent {
		b.links.Store(name, noAgent)
		return nil, nil
	}
	return b.addLink(info, dir)
}

// relisten listens again for the agent of an adopted container that has
// one (by its labels and mounts): the agent dials back while the session
// is idle, and its processes kept running.
func (b *Backend) relisten(ctx context.Context, info backends.Session, labels map[string]string, mounts []container.MountPoint) error {
	dir := agentDirOf(mounts)
	if labels[LabelAgent] != "1" || dir == "" {
		return nil
	}
	agent, err := b.usesAgent(ctx, info.Sandbox)
	if err != nil || !agent {
		return err
	}
	_, err = b.addLink(info, dir)
	return err
}

// agentDirOf is the host directory bound at agentSockDir among a
// container's mounts: the container's, whichever state directory the
// boxrt that made it had.
func agentDirOf(mounts []container.MountPoint) string {
	for _, m := range mounts {
		if m.Destination == agentSockDir && m.Type == mount.TypeBind {
			return m.Source
		}
	}
	return ""
}

// addLink starts listening in dir for container info's agent.
func (b *Backend) addLink(info backends.Session, dir string) (*agentLink, error) {
	name := info.BackendSessionID
	l := &agentLink{b: b, name: name, info: info, dir: dir}
	if err := l.listen(); err != nil {
		return nil, err
	}
	if v, loaded := b.links.LoadOrStore(name, l); loaded {
		l.ln.Close()
		l, _ = v.(*agentLink)
	}
	return l, nil
}

// dropLink forgets container name's link (the container is going away
// or boxrt is).
func (b *Backend) dropLink(name string) {
	v, ok := b.links.LoadAndDelete(name)
	if l, isLink := v.(*agentLink); ok && isLink {
		l.shut()
	}
}

// suspendLink drops container name's agent connection before the
// container stops: the agent's end is expected, not a loss.
func (b *Backend) suspendLink(name string) {
	if v, ok := b.links.Load(name); ok {
		if l, isLink := v.(*agentLink); isLink {
			l.shut()
		}
	}
}

// resumeLink listens again for container name's agent before the
// container starts.
func (b *Backend) resumeLink(name string) error {
	v, _ := b.links.Load(name)
	l, ok := v.(*agentLink)
	if !ok {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ln != nil {
		return nil
	}
	return l.listen()
}

// removeAgentDir removes container name's socket directory.
func (b *Backend) removeAgentDir(name string) error {
	if b.stateDir == "" {
		return nil
	}
	if err := os.RemoveAll(b.agentDir(name)); err != nil {
		return boxerr.Failure("docker backend: removing the agent directory of %s: %v", name, err).Wrap(err)
	}
	return nil
}

// collectAgentDirs removes the socket directories of this instance's
// containers that are gone (a removal that failed half-way, a crash),
// except those of containers being created.
func (b *Backend) collectAgentDirs(keep map[string]bool) {
	if b.stateDir == "" {
		return
	}
	parent := filepath.Dir(b.agentDir("x"))
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		if name := e.Name(); e.IsDir() && strings.HasPrefix(name, containerPrefix) && !keep[name] && !b.creating.Has(name) {
			_ = os.RemoveAll(filepath.Join(parent, name))
		}
	}
}

func (l *agentLink) listen() error {
	if l.ln != nil {
		l.ln.Close()
	}
	ln, err := sandboxagent.Listen(l.dir)
	if err != nil {
		l.ln = nil
		return boxerr.Failure("docker backend: listening for the agent of %s: %v", l.name, err).Wrap(err)
	}
	l.ln = ln
	return nil
}

// shut drops the agent's connection and stops listening: what the
// stopping agent dials meanwhile must not be taken for its successor.
func (l *agentLink) shut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.disconnect()
	if l.ln != nil {
		l.ln.Close()
		l.ln = nil
	}
}

// disconnect drops the connection without counting it lost (suspend,
// boxrt closing). Locked.
func (l *agentLink) disconnect() {
	if c := l.conn; c != nil {
		l.conn = nil
		c.Close()
	}
}

// get returns the agent's live connection and the container's
// environment, connecting first when needed; restarted reports (once) a
// restart of the container since the last call that reported one. A
// container whose agent is gone or does not connect is restarted.
func (l *agentLink) get(ctx context.Context) (conn *sandboxagent.Conn, env []string, restarted bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		select {
		case <-l.conn.Done():
			if err := l.restart(ctx); err != nil {
				return nil, nil, false, err
			}
		default:
		}
	}
	if l.conn == nil {
		if err := l.connect(ctx); err != nil {
			return nil, nil, false, err
		}
	}
	restarted, l.restarted = l.restarted, false
	return l.conn, l.env, restarted, nil
}

// openRoot opens (O_PATH) the container's root as its agent sees it,
// through /proc of the agent's host pid checked at accept, while conn is
// still the agent's live connection.
func (l *agentLink) openRoot(conn *sandboxagent.Conn) (int, error) {
	l.mu.Lock()
	pid, current := l.pid, l.conn == conn
	l.mu.Unlock()
	if pid <= 0 || !current {
		return -1, errors.New("the agent's process is not known")
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open the container's root: %w", err)
	}
	select {
	case <-conn.Done():
		unix.Close(fd)
		return -1, errors.New("the agent is gone")
	default:
		return fd, nil
	}
}

// lost is what a call says when conn went away under it: the container is
// restarted (so that nothing the agent started runs unwatched, and the
// session keeps its files), and the error says so; the next exec reports
// the restart too.
func (l *agentLink) lost(ctx context.Context, conn *sandboxagent.Conn) error {
	cause := conn.Err()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.background.Err() != nil {
		return boxerr.Failure("docker backend: the connection to the agent of %s ended: boxrt is shutting down", l.name)
	}
	if l.conn == conn {
		if err := l.restart(ctx); err != nil {
			return err
		}
	}
	return boxerr.Failure("the sandbox agent of session %s was lost while the command ran (%v): its container was restarted, "+
		"files kept, every process of the session ended; run the command again", l.info.SessionID, cause).
		With("session_id", l.info.SessionID).With("restarted", true).Wrap(cause)
}

// connect waits for the agent of a container that was started (or
// adopted) but has not connected yet. A container that is not running, or
// whose agent does not connect in time or says something wrong, is
// restarted. Locked.
func (l *agentLink) connect(ctx context.Context) error {
	c, err := l.b.inspectOwned(ctx, l.info)
	if err != nil {
		return err
	}
	if c.State == nil || !c.State.Running {
		if l.b.suspended(l.name) {
			return containerGone(l.info, -1) // Resume starts it, not a command
		}
		return l.restart(ctx)
	}
	if l.ln == nil {
		if err := l.listen(); err != nil {
			return err
		}
	}
	if err := l.accept(ctx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return l.restart(ctx)
	}
	return nil
}

// restart kills the container (whatever still runs there is unwatched)
// and starts it again as Restart does, with a fresh listening socket so
// that nothing queued by the old container's processes is taken for the
// new agent. Locked.
func (l *agentLink) restart(ctx context.Context) error {
	b := l.b
	l.disconnect()
	ctx, cancel := cleanupContext(ctx, 2*agentConnectTimeout)
	defer cancel()
	if err := b.killContainer(ctx, l.info); err != nil && !b.stopped(ctx, l.info) {
		return b.sessionError(l.info, "killing container "+l.name+" to restart it", err)
	}
	b.waitNotRunning(ctx, l.info, killGrace)
	// Only once the old processes are gone: what they dialled must not be
	// queued on the new socket.
	if err := l.listen(); err != nil {
		return err
	}
	if err := b.startStopped(ctx, l.info); err != nil {
		return err
	}
	l.restarted = true
	return l.accept(ctx)
}

// accept takes the agent's connection and reads the container's
// environment. Only the container's first process (its host pid, from
// the engine, against the kernel's word on who connected) is the agent:
// any other process of the container may dial the socket too, and its
// connection is dropped, as is one that says a wrong hello (which cannot
// tell who it was) or one queued by an agent that is gone since; the
// next may be the agent's. Under gVisor the host kernel sees every
// process of the sandbox connect as the sandbox's gofer (runsc makes the
// connection for it), so the pid tells nothing and is not checked: the
// first valid hello is taken, which after a boxrt restart may be a
// program of the session's, with no more power than the agent has (see
// docs/operations.md, the agent's trust boundary). Locked.
func (l *agentLink) accept(ctx context.Context) error {
	actx, cancel := context.WithTimeout(ctx, agentConnectTimeout)
	defer cancel()
	c, err := l.b.inspectOwned(actx, l.info)
	if err != nil {
		return err
	}
	var lastErr error
	checkPid := c.State != nil && c.State.Pid > 0 && !l.b.OnGVisor(l.info.Sandbox)
	for {
		conn, err := l.ln.Accept(actx)
		var pe *sandboxagent.ProtocolError
		switch {
		case errors.As(err, &pe) && actx.Err() == nil:
			lastErr = err
			continue
		case err != nil:
			return boxerr.Failure("docker backend: the agent of container %s did not connect: %v (before: %v)", l.name, err, lastErr).Wrap(err)
		case checkPid && conn.PeerPID() > 0 && conn.PeerPID() != c.State.Pid:
			conn.Close()
			lastErr = fmt.Errorf("a connection from pid %d, not the container's first process (%d)", conn.PeerPID(), c.State.Pid)
			continue
		}
		env, err := pid1Env(actx, conn)
		var noCat *sandboxagent.SpawnError
		if errors.As(err, &noCat) && c.Config != nil {
			// An image without cat: the engine's own list (the image's
			// and the container's variables, no HOME or HOSTNAME).
			env, err = c.Config.Env, nil
		}
		if err == nil {
			l.conn, l.env, l.pid = conn, env, 0
			if checkPid {
				l.pid = c.State.Pid
			}
			return nil
		}
		conn.Close()
		if !errors.Is(err, sandboxagent.ErrAgentLost) || actx.Err() != nil {
			return boxerr.Failure("docker backend: reading the environment of container %s: %v", l.name, err).Wrap(err)
		}
		lastErr = err
	}
}

// pid1Env reads the environment the engine gave the container's PID 1 (the
// image's, HOSTNAME and the user's HOME, as an Engine exec would get):
// the agent starts a process with exactly the environment it is given.
func pid1Env(ctx context.Context, conn *sandboxagent.Conn) ([]string, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	proc, err := conn.Spawn(ctx, sandboxagent.SpawnRequest{
		Argv: []string{"cat", "/proc/1/environ"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, Stdout: w,
	})
	w.Close()
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		_ = r.SetReadDeadline(deadline)
	}
	data, err := io.ReadAll(io.LimitReader(r, maxAgentEnv+1))
	if err != nil {
		return nil, err
	}
	if _, err := proc.Wait(ctx); err != nil {
		return nil, err
	}
	if len(data) > maxAgentEnv {
		return nil, errors.New("the environment is over 64 KiB")
	}
	var env []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, _, ok := strings.Cut(string(kv), "="); ok && k != "" {
			env = append(env, string(kv))
		}
	}
	return env, nil
}

// mergeEnv is base with extra's variables set (replacing base's of the
// same name), in envList's stable order for extra.
func mergeEnv(base []string, extra map[string]string) []string {
	if len(extra) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, replaced := extra[k]; !replaced {
			out = append(out, kv)
		}
	}
	return append(out, envList(extra)...)
}

// agentHostConfig adapts a session's HostConfig for the agent: the agent
// is PID 1 and reaps, so there is no engine init; its threads share the
// container's pids cgroup, so the limit grows by their bound and the
// session's commands keep all of pids_limit.
func agentHostConfig(hc *container.HostConfig, agentMounts []mount.Mount) {
	noInit := false
	hc.Init = &noInit
	hc.Mounts = append(hc.Mounts, agentMounts...)
	if hc.PidsLimit != nil {
		pids := *hc.PidsLimit + sandboxagent.MaxThreads
		hc.PidsLimit = &pids
	}
}
