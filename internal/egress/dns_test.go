package egress

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/boxrt/boxrt/internal/netns"
	"golang.org/x/net/dns/dnsmessage"
)

func TestDNSAsksOutOnlyForAllowedNames(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	lookup := func(_ context.Context, name string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, name)
		return []netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("10.0.0.7")}, nil
	}
	e := newEnv(t, `{"allow":["ext.test","api.test"]}`, nil, func(c *Config) { c.Lookup = lookup })

	if rc, addrs := e.lookup(t, "c2VjcmV0.exfil.test"); rc != dnsmessage.RCodeRefused || len(addrs) != 0 {
		t.Errorf("a name the policy does not allow: %v %v", rc, addrs)
	}
	// The private address the host's resolver gives is left out.
	if rc, addrs := e.lookup(t, "ext.test"); rc != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0].String() != "198.51.100.7" {
		t.Errorf("an allowed name: %v %v", rc, addrs)
	}
	// The operator's table answers without asking out.
	if rc, addrs := e.lookup(t, "api.test"); rc != dnsmessage.RCodeSuccess || len(addrs) != 1 || addrs[0].String() != apiAddr {
		t.Errorf("a name in egress.hosts: %v %v", rc, addrs)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "ext.test" {
		t.Errorf("the host's resolver was asked for %q", asked)
	}
}

func TestDNSHostileQueries(t *testing.T) {
	e := newEnv(t, `{"allow":["api.test"]}`, nil)
	query := func(h dnsmessage.Header, qs ...dnsmessage.Question) []byte {
		b := dnsmessage.NewBuilder(nil, h)
		_ = b.StartQuestions()
		for _, q := range qs {
			_ = b.Question(q)
		}
		m, _ := b.Finish()
		return m
	}
	q := func(name string, typ dnsmessage.Type) dnsmessage.Question {
		return dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}
	}
	for _, c := range []struct {
		what  string
		msg   []byte
		reply bool
		rcode dnsmessage.RCode
		n     int
	}{
		{"garbage", []byte("\x00\x01garbage"), false, 0, 0},
		{"a response", query(dnsmessage.Header{ID: 1, Response: true}, q("api.test.", dnsmessage.TypeA)), false, 0, 0},
		{"two questions", query(dnsmessage.Header{ID: 2}, q("api.test.", dnsmessage.TypeA), q("api.test.", dnsmessage.TypeA)), true, dnsmessage.RCodeFormatError, 0},
		{"AAAA", query(dnsmessage.Header{ID: 3}, q("api.test.", dnsmessage.TypeAAAA)), true, dnsmessage.RCodeSuccess, 0},
		{"not a host name", query(dnsmessage.Header{ID: 4}, q("a b.test.", dnsmessage.TypeA)), true, dnsmessage.RCodeRefused, 0},
		{"A", query(dnsmessage.Header{ID: 5}, q("API.Test.", dnsmessage.TypeA)), true, dnsmessage.RCodeSuccess, 1},
	} {
		resp, err := e.exchange(c.msg, 500*time.Millisecond)
		if !c.reply {
			if err == nil {
				t.Errorf("%s: answered", c.what)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.what, err)
			continue
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil || m.RCode != c.rcode || len(m.Answers) != c.n {
			t.Errorf("%s: %v rcode %v, %d answers", c.what, err, m.RCode, len(m.Answers))
		}
	}
	// The resolver still serves.
	if rc, _ := e.lookup(t, "api.test"); rc != dnsmessage.RCodeSuccess {
		t.Errorf("after hostile queries: %v", rc)
	}
}

// exchange sends one raw datagram to the sandbox's resolver (any address
// on port 53 reaches it) and waits for an answer.
func (e *env) exchange(msg []byte, wait time.Duration) ([]byte, error) {
	var conn net.Conn
	if err := netns.Do(e.ns, func() (err error) {
		conn, err = net.Dial("udp4", "192.0.2.53:53")
		return err
	}); err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(wait))
	if _, err := conn.Write(msg); err != nil {
		return nil, err
	}
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	return buf[:n], err
}
