package egress

import (
	"errors"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsTTL is what answers tell the sandbox; the session remembers longer.
const dnsTTL = 60

// maxAnswers bounds the addresses one answer carries.
const maxAnswers = 16

// dnsMemory remembers which name the resolver answered with which
// address, so a connection that carries no name of its own (SSH, a
// database) is decided by the name it was looked up under. Bounded: the
// oldest addresses are forgotten first.
type dnsMemory struct {
	mu    sync.Mutex
	max   int
	names map[netip.Addr]answered
	order []netip.Addr
}

type answered struct {
	name      string
	fromHosts bool
}

func newDNSMemory(max int) *dnsMemory {
	return &dnsMemory{max: max, names: map[netip.Addr]answered{}}
}

func (m *dnsMemory) remember(a netip.Addr, name string, fromHosts bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.names[a]; !ok {
		if len(m.order) >= m.max {
			delete(m.names, m.order[0])
			m.order = m.order[1:]
		}
		m.order = append(m.order, a)
	}
	m.names[a] = answered{name, fromHosts}
}

func (m *dnsMemory) lookup(a netip.Addr) (answered, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.names[a]
	return v, ok
}

func (s *Session) serveDNS() {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := s.l.dns.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		select {
		case s.dnsSlots <- struct{}{}:
		default:
			continue // busy: the client asks again
		}
		q := append([]byte(nil), buf[:n]...)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-s.dnsSlots }()
			if resp := s.answer(q); resp != nil {
				_, _ = s.l.dns.WriteToUDPAddrPort(resp, from)
			}
		}()
	}
}

// answer builds the reply to one query; nil drops it (not a query).
func (s *Session) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	reply := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		reply.RCode = dnsmessage.RCodeFormatError
		return build(reply, nil, nil)
	}
	q := qs[0]
	if h.OpCode != 0 || q.Class != dnsmessage.ClassINET {
		reply.RCode = dnsmessage.RCodeNotImplemented
		return build(reply, &q, nil)
	}
	name := canonicalName(q.Name.String())
	addrs := s.answerable(name)
	if len(addrs) == 0 {
		reply.RCode = dnsmessage.RCodeRefused
		s.denied(target{name: name}, "dns: "+reasonNotAllow)
		return build(reply, &q, nil)
	}
	if q.Type != dnsmessage.TypeA {
		// The name exists but the sandbox reaches it over IPv4 only.
		return build(reply, &q, nil)
	}
	return build(reply, &q, addrs)
}

// answerable are the addresses DNS may give the sandbox for name, each
// remembered under it. Only names the policy allows (or the operator's
// table holds) are ever looked up, so a question cannot carry data out
// through the host's resolver.
func (s *Session) answerable(name string) []netip.Addr {
	if name == "" {
		return nil
	}
	pol := s.Policy()
	found, fromHosts := s.p.resolve(s.ctx, name, pol.allowsNameSomewhere(name) && !pol.deniesNameEverywhere(name))
	var out []netip.Addr
	for _, a := range found {
		if len(out) < maxAnswers && pol.answerable(name, a, fromHosts, s.special) {
			out = append(out, a)
			s.dns.remember(a, name, fromHosts)
		}
	}
	return out
}

func build(h dnsmessage.Header, q *dnsmessage.Question, addrs []netip.Addr) []byte {
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	if q == nil {
		out, _ := b.Finish()
		return out
	}
	_ = b.StartQuestions()
	_ = b.Question(*q)
	_ = b.StartAnswers()
	for _, a := range addrs {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}, dnsmessage.AResource{A: a.As4()})
	}
	out, _ := b.Finish()
	return out
}
