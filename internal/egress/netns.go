package egress

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"

	"github.com/boxrt/boxrt/internal/netns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// listeners are a session's two sockets inside its namespace.
type listeners struct {
	tcp *net.TCPListener
	dns *net.UDPConn
}

func (l listeners) close() {
	if l.tcp != nil {
		l.tcp.Close()
	}
	if l.dns != nil {
		l.dns.Close()
	}
}

// prepareNetns brings the namespace's loopback up, routes every IPv4
// destination into it (so a connection to any address reaches the
// redirect) and opens the proxy's and the resolver's sockets on its
// 127.0.0.1. IPv6 gets no route beyond ::1.
func prepareNetns(ns *os.File) (l listeners, err error) {
	err = netns.Do(ns, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return fmt.Errorf("setting lo up: %w", err)
		}
		_, all, _ := net.ParseCIDR("0.0.0.0/0")
		// With src, the sandbox's sockets send from 127.0.0.1 (not
		// 0.0.0.0, to which no answer could be addressed).
		route := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: all, Scope: netlink.SCOPE_LINK, Src: net.IPv4(127, 0, 0, 1)}
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("routing into lo: %w", err)
		}
		if l.tcp, err = net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			return err
		}
		l.dns, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		return err
	})
	if err != nil {
		l.close()
		return listeners{}, err
	}
	return l, nil
}

// nftTable is boxrt's table in a session's namespace.
const nftTable = "boxrt_egress"

// installRules replaces boxrt's nftables table in the namespace, in one
// transaction: IPv4 TCP to anything but loopback is redirected to the
// proxy, UDP to port 53 to the resolver; output to anything but loopback
// is dropped (the redirected packets are loopback by then).
func installRules(ns *os.File, proxyPort, dnsPort uint16) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: nftTable, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	nat := c.AddChain(&nftables.Chain{Name: "redirect", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest})
	drop := nftables.ChainPolicyDrop
	filter := c.AddChain(&nftables.Chain{Name: "only_loopback", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	loopback4 := concat(ipv4(), destIn(16, []byte{255, 0, 0, 0}, []byte{127, 0, 0, 0}))
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	for _, r := range [][]expr.Any{
		concat(loopback4, []expr.Any{accept}),
		concat(ipv4(), l4(unix.IPPROTO_TCP), redirect(proxyPort)),
		concat(ipv4(), l4(unix.IPPROTO_UDP), destPort(53), redirect(dnsPort)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: r})
	}
	loopback6 := concat(ipv6(), destIn(24, bytes.Repeat([]byte{0xff}, 16), net.IPv6loopback))
	// Answers to redirected connections and queries are let through as
	// conntrack's replies, whatever their addresses.
	established := []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
	for _, r := range [][]expr.Any{
		concat(established, []expr.Any{accept}),
		concat(loopback4, []expr.Any{accept}),
		concat(loopback6, []expr.Any{accept}),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: filter, Exprs: r})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing nftables rules: %w", err)
	}
	return nil
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func family(f byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f}},
	}
}

func ipv4() []expr.Any { return family(unix.NFPROTO_IPV4) }
func ipv6() []expr.Any { return family(unix.NFPROTO_IPV6) }

func l4(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// destIn matches a destination address (at offset in the network header)
// whose bits under mask equal want.
func destIn(offset uint32, mask, want []byte) []expr.Any {
	n := uint32(len(mask))
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: want},
	}
}

func destPort(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

// originalDst is where the sandbox meant to connect before the redirect.
func originalDst(c *net.TCPConn) (ip [4]byte, port uint16, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return ip, 0, err
	}
	var sa *unix.IPv6Mreq
	cerr := raw.Control(func(fd uintptr) {
		// SO_ORIGINAL_DST fills a sockaddr_in; IPv6Mreq is the 20-byte
		// buffer x/sys offers for it.
		sa, err = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	})
	if cerr != nil {
		return ip, 0, cerr
	}
	if err != nil {
		return ip, 0, err
	}
	port = binary.BigEndian.Uint16(sa.Multiaddr[2:4])
	copy(ip[:], sa.Multiaddr[4:8])
	return ip, port, nil
}
