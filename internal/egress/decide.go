package egress

import (
	"net"
	"net/netip"
)

// specialPrefixes are never reached through "on" or a name rule: private,
// loopback, link-local (cloud metadata lives there), shared, multicast and
// reserved ranges.
var specialPrefixes = func() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
		"::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "64:ff9b::/96",
	} {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}()

// ownAddrs are the host's own addresses, read once per Attach: a service
// bound to one of them is as private as one on loopback.
func ownAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out
}

// target is what the proxy knows about one connection when it decides.
type target struct {
	name string // from SNI, Host or the session's DNS memory; "" if none
	dst  netip.AddrPort
	// resolved: dst is one of the addresses boxrt resolved for name.
	resolved bool
	// fromHosts: the operator's egress.hosts table gave dst for name.
	fromHosts bool
}

// Denial reasons: what a denial event and the counters say, never more.
const (
	reasonOff      = "network off"
	reasonDenied   = "denied by rule"
	reasonPrivate  = "private or host address"
	reasonNotAllow = "not allowed"
	reasonMismatch = "address is not one the name resolves to"
	reasonLimit    = "connection limit"
	reasonNoDst    = "no original destination"
)

// decide returns "" when t may go out under p, else why not. special
// tells whether an address is private, reserved or the host's own.
func (p Policy) decide(t target, special func(netip.Addr) bool) string {
	a, port := t.dst.Addr().Unmap(), t.dst.Port()
	switch {
	case p.Mode == ModeOff:
		return reasonOff
	case t.name != "" && p.deniesName(t.name, port), p.deniesAddr(a, port):
		return reasonDenied
	case p.namesAddr(a, port):
		return ""
	}
	if t.name != "" && p.allowsName(t.name, port) && p.Mode == ModeRules {
		switch {
		case !t.resolved:
			return reasonMismatch
		case special(a) && !t.fromHosts:
			return reasonPrivate
		}
		return ""
	}
	if p.Mode == ModeOn {
		if special(a) && !(t.resolved && t.fromHosts) {
			return reasonPrivate
		}
		return ""
	}
	return reasonNotAllow
}

// answerable tells whether DNS may give the sandbox address a for name:
// the name is allowed and a is public or operator-given, or a rule names
// a itself; no deny rule closes either outright.
func (p Policy) answerable(name string, a netip.Addr, fromHosts bool, special func(netip.Addr) bool) bool {
	if p.Mode == ModeOff || p.deniesNameEverywhere(name) || p.deniesAddrEverywhere(a) {
		return false
	}
	if p.namesAddrSomewhere(a) {
		return true
	}
	return p.allowsNameSomewhere(name) && (fromHosts || !special(a))
}

func isSpecial(a netip.Addr, own map[netip.Addr]bool) bool {
	a = a.Unmap()
	if own[a] {
		return true
	}
	for _, p := range specialPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
