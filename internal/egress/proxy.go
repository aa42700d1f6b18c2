package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Config is the proxy's configuration, shared by every session.
type Config struct {
	// Hosts is the operator's egress.hosts table, name → address. Its
	// addresses count as named by the operator: a session whose policy
	// allows the name reaches them even when they are private.
	Hosts map[string]string
	// Lookup resolves a name the policy allows and Hosts lacks (IPv4
	// only: sessions have no IPv6 way out). Default: the host's resolver.
	Lookup func(ctx context.Context, name string) ([]netip.Addr, error)
	// UpstreamRoots verify servers whose TLS the proxy terminates (hosts
	// that carry a secret). Default: the host's roots.
	UpstreamRoots *x509.CertPool
	// OnDenied hears every refused connection and DNS question. It runs
	// on the connection's goroutine and must not block.
	OnDenied func(Denial)
	// Restore, when it knows the session, gives what an attachment
	// carries over from an earlier one instead of the Attachment's: a
	// backend re-attaching a sandbox adopted after a restart knows neither
	// the policy a live update gave it nor its secrets.
	Restore func(sessionID string) (Restored, bool)
	Limits  Limits
	Log     zerolog.Logger
}

// Limits bound what the sandboxes can make the proxy hold. Zero fields
// take the defaults.
type Limits struct {
	Conns        int           // open connections, all sessions (4096)
	SessionConns int           // open connections per session (256)
	PeekBytes    int           // bytes read to find a name (16 KiB)
	PeekTimeout  time.Duration // wait for them (1 s); then the address decides
	DialTimeout  time.Duration // connecting out (10 s)
	IdleTimeout  time.Duration // a connection with no byte either way ends (5 min)
	LookupTime   time.Duration // one name resolution (5 s)
	DNSInflight  int           // DNS questions answered at once per session (32)
	DNSMemory    int           // addresses a session remembers names for (4096)
}

func (l *Limits) fill() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	dur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.Conns, 4096)
	def(&l.SessionConns, 256)
	def(&l.PeekBytes, 16<<10)
	def(&l.DNSInflight, 32)
	def(&l.DNSMemory, 4096)
	dur(&l.PeekTimeout, time.Second)
	dur(&l.DialTimeout, 10*time.Second)
	dur(&l.IdleTimeout, 5*time.Minute)
	dur(&l.LookupTime, 5*time.Second)
}

// Proxy is boxrt's one egress proxy; sessions attach to it.
type Proxy struct {
	cfg   Config
	hosts map[string]netip.Addr
	conns atomic.Int64
	// Totals over every session, those closed included (for /metrics).
	allowedN, deniedN     atomic.Uint64
	retiredOut, retiredIn atomic.Uint64

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
}

// New checks the configuration and returns a proxy with no session.
func New(cfg Config) (*Proxy, error) {
	cfg.Limits.fill()
	if cfg.Lookup == nil {
		cfg.Lookup = func(ctx context.Context, name string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip4", name)
		}
	}
	hosts := map[string]netip.Addr{}
	for name, addr := range cfg.Hosts {
		n := canonicalName(name)
		if n == "" {
			return nil, boxerr.Validation("egress.hosts", "egress.hosts: %q is not a host name", clipText(name))
		}
		a, err := netip.ParseAddr(strings.TrimSpace(addr))
		if err != nil || a.Zone() != "" {
			return nil, boxerr.Validation("egress.hosts", "egress.hosts[%q]: %q is not an IP address", n, clipText(addr))
		}
		hosts[n] = a.Unmap()
	}
	return &Proxy{cfg: cfg, hosts: hosts, sessions: map[*Session]struct{}{}}, nil
}

// Close ends every session's listeners and connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	list := make([]*Session, 0, len(p.sessions))
	for s := range p.sessions {
		list = append(list, s)
	}
	p.mu.Unlock()
	for _, s := range list {
		s.Close()
	}
}

// Attachment is what Attach needs about a session.
type Attachment struct {
	// ID tags the session's counters, logs and denials.
	ID string
	// NetNS is the session's network namespace, owned by the initial user
	// namespace (the sandbox must have no power over it). The caller
	// keeps it; Attach does not close it.
	NetNS   *os.File
	Policy  Policy
	Secrets []Secret
}

// Attach configures the session's namespace so that its only way out is
// this proxy and starts serving it. Closing the session stops serving; the
// namespace keeps its rules, so the sandbox stays cut off.
func (p *Proxy) Attach(a Attachment) (_ *Session, err error) {
	if a.NetNS == nil {
		return nil, boxerr.Validation("netns", "egress: no network namespace to attach")
	}
	s := &Session{p: p, id: a.ID, own: ownAddrs(), stats: newCounters(), conns: map[*proxied]struct{}{},
		dns: newDNSMemory(p.cfg.Limits.DNSMemory), dnsSlots: make(chan struct{}, p.cfg.Limits.DNSInflight)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.cancel()
		}
	}()
	pol, secrets, ident := a.Policy, a.Secrets, Identity{}
	if p.cfg.Restore != nil {
		if r, ok := p.cfg.Restore(a.ID); ok {
			if r.Policy != nil {
				pol = *r.Policy
			}
			if r.Secrets != nil {
				secrets, ident = r.Secrets, r.Identity
			}
		}
	}
	s.policy.Store(&pol)
	if err := ValidateSecrets(secrets, "secrets"); err != nil {
		return nil, err
	}
	if s.secrets, err = newSessionSecrets(secrets, ident.Placeholders); err != nil {
		return nil, err
	}
	if len(s.secrets) > 0 {
		if s.ca, err = sessionCAFor(a.ID, s.secrets, ident); err != nil {
			return nil, err
		}
	}
	if s.l, err = prepareNetns(a.NetNS); err != nil {
		return nil, boxerr.Failure("egress: preparing the session's network namespace: %v", err).Wrap(err)
	}
	tcpPort := uint16(s.l.tcp.Addr().(*net.TCPAddr).Port)
	dnsPort := uint16(s.l.dns.LocalAddr().(*net.UDPAddr).Port)
	if err := installRules(a.NetNS, tcpPort, dnsPort); err != nil {
		s.l.close()
		return nil, boxerr.Failure("egress: %v", err).Wrap(err)
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		s.l.close()
		return nil, boxerr.RuntimeUnavailable("egress: the proxy is shut down")
	}
	p.sessions[s] = struct{}{}
	p.mu.Unlock()
	s.wg.Add(2)
	go s.serveTCP()
	go s.serveDNS()
	return s, nil
}

// Session is one attached namespace.
type Session struct {
	p       *Proxy
	id      string
	l       listeners
	policy  atomic.Pointer[Policy]
	secrets []sessionSecret
	ca      *sessionCA
	own     map[netip.Addr]bool
	stats   *counters
	dns     *dnsMemory
	active  atomic.Int64
	// dnsSlots bounds the questions answered at once.
	dnsSlots chan struct{}
	// ctx ends with the session: lookups and dials in progress stop.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[*proxied]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Update applies p to new connections and closes the open ones p denies.
func (s *Session) Update(p Policy) {
	s.policy.Store(&p)
	var closed []*proxied
	s.mu.Lock()
	for c := range s.conns {
		if p.decide(c.t, s.special) != "" {
			c.close()
			closed = append(closed, c)
		}
	}
	s.mu.Unlock()
	// Outside the lock: the callback may call back into the session.
	for _, c := range closed {
		s.denied(c.t, "closed by policy update: "+p.decide(c.t, s.special))
	}
}

// Policy is the policy in force.
func (s *Session) Policy() Policy { return *s.policy.Load() }

// Stats are the session's counters now.
func (s *Session) Stats() Stats {
	st := s.stats.snapshot()
	st.Active = int(s.active.Load())
	return st
}

// Env is what the sandbox's environment gets for its secrets: each name
// with its placeholder.
func (s *Session) Env() map[string]string {
	out := make(map[string]string, len(s.secrets))
	for _, sec := range s.secrets {
		out[sec.name] = sec.placeholder
	}
	return out
}

// Identity is what the session's secrets must keep in a later
// attachment (Restored): their placeholders and the session CA.
func (s *Session) Identity() (Identity, error) {
	id := Identity{Placeholders: make(map[string]string, len(s.secrets))}
	for _, sec := range s.secrets {
		id.Placeholders[sec.name] = sec.placeholder
	}
	if s.ca != nil {
		key, err := x509.MarshalPKCS8PrivateKey(s.ca.key)
		if err != nil {
			return Identity{}, err
		}
		id.CACert, id.CAKey = s.ca.cert.Raw, key
	}
	return id, nil
}

// CAPEM is the session CA's certificate, nil when no secret needs it.
func (s *Session) CAPEM() []byte {
	if s.ca == nil {
		return nil
	}
	return append([]byte(nil), s.ca.pem...)
}

// CABundle is the host's trusted roots plus the session CA, for the file
// TrustEnv names; nil when no secret needs it.
func (s *Session) CABundle() ([]byte, error) {
	if s.ca == nil {
		return nil, nil
	}
	return s.ca.bundle()
}

// TrustEnv are the variables that point the sandbox's TLS clients at the
// bundle the backend wrote at path (inside the sandbox).
func TrustEnv(path string) map[string]string {
	return map[string]string{"SSL_CERT_FILE": path, "REQUESTS_CA_BUNDLE": path, "NODE_EXTRA_CA_CERTS": path}
}

// Close stops serving the session: listeners, connections, DNS.
func (s *Session) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.cancel()
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	s.l.close()
	s.wg.Wait()
	s.p.mu.Lock()
	delete(s.p.sessions, s)
	s.p.retiredOut.Add(s.stats.bytesOut.Load())
	s.p.retiredIn.Add(s.stats.bytesIn.Load())
	s.p.mu.Unlock()
}

// Session returns the attached session tagged id, nil when none is.
func (p *Proxy) Session(id string) *Session {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.sessions {
		if s.id == id {
			return s
		}
	}
	return nil
}

// Totals are the proxy's counters over all sessions, closed ones
// included: connections allowed and denied, bytes each way, sessions and
// connections open now.
type Totals struct {
	Allowed, Denied   uint64
	BytesOut, BytesIn uint64
	Sessions          int
	Conns             int64
}

// Totals returns the proxy's counters now.
func (p *Proxy) Totals() Totals {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := Totals{Allowed: p.allowedN.Load(), Denied: p.deniedN.Load(), BytesOut: p.retiredOut.Load(),
		BytesIn: p.retiredIn.Load(), Sessions: len(p.sessions), Conns: p.conns.Load()}
	for s := range p.sessions {
		t.BytesOut += s.stats.bytesOut.Load()
		t.BytesIn += s.stats.bytesIn.Load()
	}
	return t
}

func (s *Session) special(a netip.Addr) bool { return isSpecial(a, s.own) }

// admit takes a connection slot, or says the limits are reached.
func (s *Session) admit() bool {
	lim := s.p.cfg.Limits
	if s.p.conns.Add(1) > int64(lim.Conns) {
		s.p.conns.Add(-1)
		return false
	}
	if s.active.Add(1) > int64(lim.SessionConns) {
		s.active.Add(-1)
		s.p.conns.Add(-1)
		return false
	}
	return true
}

func (s *Session) release() {
	s.active.Add(-1)
	s.p.conns.Add(-1)
}

func (s *Session) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.l.tcp.AcceptTCP()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors and the like: let them drain.
			s.p.cfg.Log.Warn().Str("session", s.id).Err(err).Msg("egress: accept")
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if !s.admit() {
			ip, port, _ := originalDst(c)
			_ = c.SetLinger(0)
			c.Close()
			s.denied(target{dst: netip.AddrPortFrom(netip.AddrFrom4(ip), port)}, reasonLimit)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.release()
			s.handle(c)
		}()
	}
}

func (s *Session) allowed(t target) {
	s.p.allowedN.Add(1)
	s.stats.count(true, label(t.name, t.dst.Addr()), t.dst.Port())
}

func (s *Session) denied(t target, reason string) {
	s.p.deniedN.Add(1)
	s.stats.count(false, label(t.name, t.dst.Addr()), t.dst.Port())
	s.p.cfg.Log.Debug().Str("session", s.id).Str("name", t.name).Stringer("dst", t.dst).Str("reason", reason).Msg("egress: denied")
	if s.p.cfg.OnDenied != nil {
		s.p.cfg.OnDenied(Denial{Session: s.id, Name: t.name, Addr: t.dst.Addr(), Port: t.dst.Port(), Reason: reason})
	}
}

// resolve gives the addresses boxrt itself finds for name: the operator's
// table first, then (when external) the host's resolver.
func (p *Proxy) resolve(ctx context.Context, name string, external bool) (addrs []netip.Addr, fromHosts bool) {
	if a, ok := p.hosts[name]; ok {
		return []netip.Addr{a}, true
	}
	if !external {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.LookupTime)
	defer cancel()
	found, err := p.cfg.Lookup(ctx, name)
	if err != nil {
		return nil, false
	}
	for _, a := range found {
		if a = a.Unmap(); a.Is4() {
			addrs = append(addrs, a)
		}
	}
	return addrs, false
}
