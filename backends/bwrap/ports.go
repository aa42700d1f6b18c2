package bwrap

import (
	"context"
	"errors"
	"net"
	"strconv"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/netns"
)

// DialSessionPort connects to 127.0.0.1:port in the network namespace of
// the session's resident sandbox (its agent's), from boxrt's side: the
// sandbox's own network policy does not matter, and it gains nothing. A
// session whose sandbox is not running (released when idle, or never
// started) has nothing listening: that is said, not papered over by
// starting an empty sandbox.
func (b *Backend) DialSessionPort(ctx context.Context, info backends.Session, port int) (net.Conn, error) {
	b.mu.Lock()
	sf := b.open[info.BackendSessionID]
	b.mu.Unlock()
	var m *machine
	if sf != nil {
		sf.res.mu.Lock()
		if sf.res.conn != nil {
			m = &machine{r: sf.res.r, conn: sf.res.conn}
		}
		sf.res.mu.Unlock()
	}
	if m == nil || !m.alive() {
		return nil, noSandbox(info, port)
	}
	pid := m.conn.PeerPID()
	c, err := netns.DialLoopback(ctx, "/proc/"+strconv.Itoa(pid)+"/ns/net", m.alive, port)
	if errors.Is(err, netns.ErrGone) {
		return nil, noSandbox(info, port)
	}
	return c, err
}

func noSandbox(info backends.Session, port int) error {
	return boxerr.Failure("session %s has no running sandbox (released while idle, or not started yet), so nothing listens on port %d: start the server with a command first", info.SessionID, port).
		With("session_id", info.SessionID).With("reason", "no_sandbox")
}
