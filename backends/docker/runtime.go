package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// runtimeFor is the engine runtime a session of this sandbox runs under:
// the gVisor runtime when the spec asks for gVisor (the runtime has already
// checked that the operator allowed it), the configured one otherwise ("" is
// the engine's default).
func (b *Backend) runtimeFor(sb backends.Sandbox) string {
	if sb.Isolation == backends.IsolationGVisor {
		return b.gvisorRuntime
	}
	return b.runtime
}

// isolationLevels are the levels a spec may ask for beyond the default.
func (b *Backend) isolationLevels() []string {
	if b.gvisorRuntime == "" {
		return nil
	}
	return []string{backends.IsolationGVisor}
}

// runtimeLabel names the runtime of default sessions for people: the
// configured one, else the engine's default as the first probe read it.
func (b *Backend) runtimeLabel() string {
	if b.runtime != "" {
		return b.runtime
	}
	b.runtimesMu.Lock()
	defer b.runtimesMu.Unlock()
	if b.engineDefaultRuntime != "" {
		return b.engineDefaultRuntime
	}
	return "engine default runtime"
}

// checkRuntimes reads the engine's runtimes until every runtime boxrt was
// configured with is registered (then the reading is kept): the default
// (for Describe), and each runtime's arguments (whether gVisor allows the
// agent's socket, see gvisorAgentOff). A missing runtime would otherwise
// surface as an engine error at the first session create, naming no
// setting.
func (b *Backend) checkRuntimes(ctx context.Context) error {
	var want []string
	for _, r := range []string{b.runtime, b.gvisorRuntime} {
		if r != "" && !slices.Contains(want, r) {
			want = append(want, r)
		}
	}
	b.runtimesMu.Lock()
	defer b.runtimesMu.Unlock()
	if b.runtimesOK {
		return nil
	}
	if err := b.readRuntimes(ctx); err != nil {
		return err
	}
	if len(want) > 0 {
		podman, err := b.isPodman(ctx)
		if err != nil {
			return err
		}
		if podman {
			// Its Docker API lists runtimes but ignores HostConfig.Runtime
			// (the container reports "oci" and runs the default): asking
			// for gVisor there would silently give runc.
			return podmanRuntimeError(b.cli.DaemonHost(), want)
		}
	}
	have := make([]string, 0, len(b.runtimeArgs))
	for name := range b.runtimeArgs {
		have = append(have, name)
	}
	sort.Strings(have)
	for _, r := range want {
		if !slices.Contains(have, r) {
			return boxerr.BackendUnavailable("Docker engine at %s has no runtime %q (it has: %s); register it in /etc/docker/daemon.json "+
				"(scripts/setup does for runsc) and reload dockerd, or change docker.runtime / docker.gvisor_runtime",
				b.cli.DaemonHost(), r, strings.Join(have, ", "))
		}
	}
	b.runtimesOK = true
	return nil
}

// readRuntimes reads the engine's default runtime and its runtimes'
// registered arguments. Locked.
func (b *Backend) readRuntimes(ctx context.Context) error {
	info, err := b.cli.Info(ctx)
	if err != nil {
		return b.apiError("reading the engine's runtimes", err)
	}
	b.engineDefaultRuntime = info.DefaultRuntime
	b.runtimeArgs = make(map[string][]string, len(info.Runtimes))
	for name, r := range info.Runtimes {
		b.runtimeArgs[name] = r.Args
	}
	return nil
}

// gvisorAgentOff says why sessions under gVisor runtime rt cannot use the
// session agent ("" when they can): runsc refuses a sandbox's connect() to
// a host unix socket, the agent's, unless the engine runs it with
// --host-uds=open (or all; measured with runsc 20221219: EPERM without,
// descriptors pass with it). The engine's registration is read once, with
// the other runtimes; a change needs a boxrt restart to be seen.
func (b *Backend) gvisorAgentOff(ctx context.Context, rt string) (string, error) {
	b.runtimesMu.Lock()
	defer b.runtimesMu.Unlock()
	if b.runtimeArgs == nil {
		if err := b.readRuntimes(ctx); err != nil {
			return "", err
		}
	}
	return agentOffFor(rt, b.runtimeArgs), nil
}

// gvisorAgentNote is gvisorAgentOff for Describe, which does no I/O: ""
// when no gVisor runtime is configured, the agent is not used anyway, or
// the engine's runtimes were not read yet.
func (b *Backend) gvisorAgentNote() string {
	rt := b.gvisorRuntime
	if b.isGVisor(b.runtime) {
		rt = b.runtime
	}
	if rt == "" || b.agentBinary == "" || b.stateDir == "" || !b.localEngine() {
		return ""
	}
	b.runtimesMu.Lock()
	defer b.runtimesMu.Unlock()
	if b.runtimeArgs == nil {
		return ""
	}
	return agentOffFor(rt, b.runtimeArgs)
}

// agentOffFor is gvisorAgentOff's verdict on the engine's registered
// runtimes.
func agentOffFor(rt string, runtimes map[string][]string) string {
	args, ok := runtimes[rt]
	switch {
	case !ok:
		return fmt.Sprintf("the engine has no runtime %q", rt)
	case !hostUDSOpen(args):
		return fmt.Sprintf("gVisor runtime %q is registered without --host-uds=open (runtimeArgs %q), so runsc refuses the agent's connect() "+
			"to its host socket; scripts/setup registers it with the flag", rt, args)
	}
	return ""
}

// hostUDSOpen tells whether runsc arguments let the sandbox connect to
// host unix sockets: --host-uds open or all (the last one given counts,
// as in runsc's flag parsing), or the deprecated --fsgofer-host-uds.
func hostUDSOpen(args []string) bool {
	open := false
	for i := 0; i < len(args); i++ {
		if !strings.HasPrefix(args[i], "-") {
			continue
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		switch name {
		case "host-uds":
			if !hasVal && i+1 < len(args) {
				i++
				val = args[i]
			}
			open = val == "open" || val == "all"
		case "fsgofer-host-uds":
			open = !hasVal || val == "true"
		}
	}
	return open
}

// isGVisor tells whether an engine runtime name is gVisor's: the one the
// operator configured for isolation "gvisor", or one named runsc*.
func (b *Backend) isGVisor(rt string) bool {
	return rt != "" && (rt == b.gvisorRuntime || strings.HasPrefix(rt, "runsc"))
}

// gVisor runs every sandboxed task on host threads of its own, all in the
// container's pids cgroup: measured here (runsc 20221219, ptrace platform),
// an idle sandbox holds about 45 host pids and each sleeping process about
// 11 more. A pids_limit meant as "processes in the sandbox" therefore
// becomes a host limit of gvisorPidsBase + gvisorPidsPerTask per process;
// a fork bomb still ends at that ceiling, with the sandbox's own kernel
// failing to start more tasks instead of the host's.
const (
	gvisorPidsBase    = 64
	gvisorPidsPerTask = 16
)

// PidsCgroupLimit is the pids cgroup limit the container of a session of
// this sandbox gets: pids_limit, scaled for gVisor's host threads, before
// the allowance for the session agent's threads where the agent serves
// (agentHostConfig).
func (b *Backend) PidsCgroupLimit(sb backends.Sandbox) int64 {
	if b.isGVisor(b.runtimeFor(sb)) {
		return int64(gvisorPidsBase + gvisorPidsPerTask*sb.PidsLimit)
	}
	return int64(sb.PidsLimit)
}

// OnGVisor tells whether sessions of this sandbox run under gVisor.
func (b *Backend) OnGVisor(sb backends.Sandbox) bool { return b.isGVisor(b.runtimeFor(sb)) }

// MeasureIsolation measures this backend's isolation by probing a real
// sandbox of each level it offers (backends.MeasureIsolation).
func (b *Backend) MeasureIsolation(ctx context.Context) []backends.IsolationReport {
	return backends.MeasureIsolation(ctx, b)
}

// exitWatch returns a channel closed when the session's container stops,
// and a func releasing the watch. dockerd ends the attached streams of a
// runc container's execs when the container dies, but not of a gVisor one
// (its sandbox is OOM-killed as a whole, for one): without the watch an
// exec or a managed process there would wait for output forever. Other
// runtimes get a nil channel (never ready) and no engine request.
func (b *Backend) exitWatch(ctx context.Context, info backends.Session) (<-chan struct{}, func()) {
	if !b.OnGVisor(info.Sandbox) {
		return nil, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	exited := make(chan struct{})
	waitC, errC := b.cli.ContainerWait(ctx, info.BackendSessionID, container.WaitConditionNotRunning)
	go func() {
		select {
		case <-waitC:
			close(exited)
		case err := <-errC:
			if cerrdefs.IsNotFound(err) {
				close(exited)
			}
		}
	}()
	return exited, cancel
}

// killContainer kills a session's container through the engine. A gVisor
// sandbox whose pids are exhausted (a fork bomb) cannot serve runsc's kill,
// which asks the sandbox itself, and the engine's kill then hangs
// (measured: over 30 s with runsc 20221219); after killGrace its sandbox
// process is killed from the host instead, which ends the container. That
// process is the engine's pid for the container, taken only when its
// command line is runsc's sandbox of this container (a reused pid is not).
func (b *Backend) killContainer(ctx context.Context, info backends.Session) error {
	if !b.OnGVisor(info.Sandbox) || !b.localEngine() {
		return b.cli.ContainerKill(ctx, info.BackendSessionID, "KILL")
	}
	kctx, cancel := context.WithTimeout(ctx, killGrace)
	err := b.cli.ContainerKill(kctx, info.BackendSessionID, "KILL")
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return err
	}
	c, ierr := b.cli.ContainerInspect(ctx, info.BackendSessionID)
	if ierr != nil || c.State == nil || c.State.Pid <= 0 {
		return err
	}
	cmdline, rerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.State.Pid))
	if rerr != nil || !bytes.HasPrefix(cmdline, []byte("runsc-sandbox\x00")) || !bytes.Contains(cmdline, []byte(c.ID)) {
		return err
	}
	if kerr := syscall.Kill(c.State.Pid, syscall.SIGKILL); kerr != nil {
		return err
	}
	return nil
}

// isPodman tells whether the engine is Podman's Docker-compatible API.
func (b *Backend) isPodman(ctx context.Context) (bool, error) {
	v, err := b.cli.ServerVersion(ctx)
	if err != nil {
		return false, b.apiError("reading the engine's version", err)
	}
	for _, c := range v.Components {
		if strings.Contains(c.Name, "Podman") {
			return true, nil
		}
	}
	return false, nil
}

func podmanRuntimeError(host string, want []string) error {
	return boxerr.BackendUnavailable("the engine at %s is Podman, whose Docker API ignores a container's runtime: %s cannot be honoured "+
		"(boxrt would get the default runtime instead). Set the runtime of Podman itself ([engine] runtime in the service's "+
		"containers.conf) and leave docker.runtime and docker.gvisor_runtime empty, or use dockerd for gVisor",
		host, strings.Join(want, ", "))
}

// sandboxDied is the result of an exec whose gVisor sandbox ended under
// it. The memory cgroup's OOM killer ends a gVisor sandbox as a whole (the
// sentry holds all its memory): the command was killed for memory, as
// runc's OOM killer would have killed it, so it reads as 137 (SIGKILL);
// the session is gone and the next call recreates it. Any other end is the
// session being gone.
func (b *Backend) sandboxDied(ctx context.Context, info backends.Session) (backends.ExitStatus, error) {
	ctx, cancel := cleanupContext(ctx, helperTimeout)
	defer cancel()
	if c, err := b.cli.ContainerInspect(ctx, info.BackendSessionID); err == nil && c.State != nil && c.State.OOMKilled {
		return backends.ExitStatus{ExitCode: 137}, nil
	}
	return backends.ExitStatus{}, containerGone(info, -1)
}
