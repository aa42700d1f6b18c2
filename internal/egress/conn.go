package egress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// proxied is one open connection, kept so Update and Close can end it.
type proxied struct {
	t      target
	cancel context.CancelFunc
	once   sync.Once
	closed atomic.Bool
	conns  []net.Conn
}

func (c *proxied) close() {
	c.once.Do(func() {
		c.closed.Store(true)
		c.cancel()
		for _, n := range c.conns {
			n.Close()
		}
	})
}

// handle decides one connection from the sandbox and serves it.
func (s *Session) handle(client *net.TCPConn) {
	defer client.Close()
	ip, port, err := originalDst(client)
	dst := netip.AddrPortFrom(netip.AddrFrom4(ip), port)
	if err != nil || dst.Addr().IsLoopback() {
		// Not redirected: the sandbox dialled the proxy's own port.
		s.denied(target{dst: dst}, reasonNoDst)
		return
	}
	lim := s.p.cfg.Limits
	pk := peek(client, lim.PeekBytes, lim.PeekTimeout)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	pol := s.Policy()
	t := s.target(ctx, pol, pk.name, dst)
	if reason := pol.decide(t, s.special); reason != "" {
		s.denied(t, reason)
		return
	}
	s.allowed(t)
	pc := &proxied{t: t, cancel: cancel, conns: []net.Conn{client}}
	if !s.track(pc) {
		return
	}
	defer s.untrack(pc)
	if secrets := secretsFor(s.secrets, pk.name); len(secrets) > 0 && pk.kind != kindRaw {
		s.forwardHTTP(ctx, client, pk, t, secrets)
		return
	}
	upstream, err := s.p.dial(ctx, dst)
	if err != nil {
		s.p.cfg.Log.Debug().Str("session", s.id).Str("name", t.name).Stringer("dst", dst).Err(err).Msg("egress: dial")
		return
	}
	defer upstream.Close()
	if !s.addConn(pc, upstream) {
		return
	}
	s.relay(client, upstream, pk.data)
}

// target gathers what the decision needs: the name (the connection's own,
// else the one DNS answered for its address) and whether boxrt's own
// resolution of that name gives the address the sandbox dialled.
func (s *Session) target(ctx context.Context, pol Policy, name string, dst netip.AddrPort) target {
	t := target{name: name, dst: dst}
	mem, remembered := s.dns.lookup(dst.Addr())
	if name == "" {
		if remembered {
			t.name, t.resolved, t.fromHosts = mem.name, true, mem.fromHosts
		}
		return t
	}
	if remembered && mem.name == name {
		t.resolved, t.fromHosts = true, mem.fromHosts
		return t
	}
	addrs, fromHosts := s.p.resolve(ctx, name, pol.Mode == ModeRules && pol.allowsName(name, dst.Port()))
	for _, a := range addrs {
		if a == dst.Addr() {
			t.resolved, t.fromHosts = true, fromHosts
		}
	}
	return t
}

// track registers c for Update and Close; false when the session closed
// or an Update that could not see c yet denies it.
func (s *Session) track(c *proxied) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.Policy().decide(c.t, s.special) != "" {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Session) untrack(c *proxied) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.close()
}

// addConn ties an upstream connection to c; false when c was closed
// meanwhile (by Update or Close, which close under s.mu too).
func (s *Session) addConn(c *proxied, n net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.closed.Load() {
		return false
	}
	c.conns = append(c.conns, n)
	return true
}

func (p *Proxy) dial(ctx context.Context, dst netip.AddrPort) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: p.cfg.Limits.DialTimeout}
	c, err := d.DialContext(ctx, "tcp4", dst.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// relayChunk is how much one splice call may move before the idle
// deadline is renewed.
const relayChunk = 1 << 20

// relay copies both ways (splice(2) between the sockets) until both ends
// are done, after sending what peek read.
func (s *Session) relay(client, upstream *net.TCPConn, prefix []byte) {
	idle := s.p.cfg.Limits.IdleTimeout
	if len(prefix) > 0 {
		_ = upstream.SetWriteDeadline(time.Now().Add(idle))
		n, err := upstream.Write(prefix)
		s.stats.bytesOut.Add(uint64(n))
		if err != nil {
			return
		}
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(upstream, client, &s.stats.bytesOut, idle, &last)
	}()
	pipe(client, upstream, &s.stats.bytesIn, idle, &last)
	<-done
}

// pipe moves src to dst until EOF (passed on as a half close), an error,
// or no byte moving either way for the idle time (which ends both
// connections). A splice call reports its bytes only when it returns, at
// the latest at its deadline, so a direction waiting alone ends the pair
// only when last (the pair's latest progress) is two idle periods old:
// the other direction may be moving bytes it has not reported yet.
func pipe(dst, src *net.TCPConn, counter *atomic.Uint64, idle time.Duration, last *atomic.Int64) {
	for {
		deadline := time.Now().Add(idle)
		_ = src.SetReadDeadline(deadline)
		_ = dst.SetWriteDeadline(deadline)
		n, err := io.CopyN(dst, src, relayChunk)
		if n > 0 {
			counter.Add(uint64(n))
			last.Store(time.Now().UnixNano())
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, last.Load())) < 2*idle:
			continue
		case errors.Is(err, io.EOF):
			_ = dst.CloseWrite()
			return
		}
		src.Close()
		dst.Close()
		return
	}
}
