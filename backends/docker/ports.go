package docker

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/backends/internal/procstat"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/netns"
)

// DialSessionPort connects to 127.0.0.1:port in the network namespace of
// the session's container (its PID 1's, from the inspect), from boxrt's
// side: the container's network mode does not matter, and it gains
// nothing. That needs the engine on this host; gVisor keeps its own
// network stack, out of the namespace's reach.
func (b *Backend) DialSessionPort(ctx context.Context, info backends.Session, port int) (net.Conn, error) {
	if !b.localEngine() {
		return nil, boxerr.Failure("session ports are reached through the container's network namespace, which needs the Docker engine on boxrt's host; this one is at %s", b.cli.DaemonHost()).
			With("reason", "remote_engine")
	}
	if b.OnGVisor(info.Sandbox) {
		return nil, boxerr.Failure("session %s runs under gVisor, whose network stack boxrt cannot enter: its ports cannot be exposed", info.SessionID).
			With("reason", "gvisor")
	}
	pid, id, err := b.containerPID(ctx, info)
	if err != nil {
		return nil, err
	}
	// The pid is still the container's (not reused since the inspect)
	// when its cgroup names the container's id.
	alive := func() bool {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
		return err == nil && strings.Contains(string(data), id)
	}
	c, err := netns.DialLoopback(ctx, "/proc/"+strconv.Itoa(pid)+"/ns/net", alive, port)
	if errors.Is(err, netns.ErrGone) {
		return nil, notRunning(info)
	}
	return c, err
}

// containerPID is the host pid of the session's running container's PID 1,
// and the container's full id.
func (b *Backend) containerPID(ctx context.Context, info backends.Session) (int, string, error) {
	c, err := b.inspectOwned(ctx, info)
	if err != nil {
		return 0, "", err
	}
	if c.State == nil || !c.State.Running || c.State.Pid <= 0 || len(c.ID) < 12 {
		return 0, "", notRunning(info)
	}
	return c.State.Pid, c.ID, nil
}

func notRunning(info backends.Session) error {
	return boxerr.Failure("the container of session %s is not running, so nothing listens in it", info.SessionID).
		With("session_id", info.SessionID).With("reason", "not_running")
}

// oomKills is the memory cgroup's OOM kill count of the container whose
// process (agent) is pid, -1 when unknown (a remote engine).
func (b *Backend) oomKills(pid int) int64 {
	if !b.localEngine() || pid <= 0 {
		return -1
	}
	return procstat.OOMKills(pid)
}
