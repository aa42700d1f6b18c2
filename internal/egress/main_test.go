package egress

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxrt/boxrt/internal/netns"
	"github.com/rs/zerolog"
	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"
)

// The tests run in a network namespace of their own (TestMain re-executes
// the test binary under unshare --net): there "the host" is that
// namespace, its loopback carries the test servers' addresses, and
// nothing a test does can reach another address.
const inNetnsEnv = "BOXRT_EGRESS_TEST_NETNS"

// Test servers' addresses, on the test namespace's loopback.
var (
	apiAddr   = "203.0.113.10"
	otherAddr = "203.0.113.20"
	badAddr   = "203.0.113.30"
	metaAddr  = "169.254.169.254"
)

// testHosts is the operator's egress.hosts table in the tests.
var testHosts = map[string]string{"api.test": apiAddr, "other.test": otherAddr, "bad.test": badAddr}

func TestMain(m *testing.M) {
	if os.Getenv(inNetnsEnv) == "" {
		cmd := exec.Command("unshare", append([]string{"--net", "--", os.Args[0]}, os.Args[1:]...)...)
		cmd.Env = append(os.Environ(), inNetnsEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode())
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "internal/egress tests need root and unshare(1) for their own network namespace: %v\n", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	if err := setupTestNS(); err != nil {
		fmt.Fprintf(os.Stderr, "setting up the test network namespace: %v\n", err)
		os.Exit(2)
	}
	goleak.VerifyTestMain(m)
}

func setupTestNS() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	for _, a := range []string{apiAddr, otherAddr, badAddr, metaAddr} {
		addr, err := netlink.ParseAddr(a + "/32")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			return err
		}
	}
	return nil
}

// newSandboxNS makes a network namespace as a backend would: owned by
// the test's (initial) user namespace, nothing in it but lo.
func newSandboxNS(t testing.TB) *os.File {
	t.Helper()
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// This thread never leaves the new namespace: it ends with the
		// goroutine, which is still locked to it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- result{err: err}
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		ch <- result{f, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.f.Close() })
	return r.f
}

// env is a proxy with one attached sandbox namespace.
type env struct {
	p      *Proxy
	s      *Session
	ns     *os.File
	logs   *syncBuffer
	denied chan Denial
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func newEnv(t testing.TB, policy string, secrets []Secret, mutate ...func(*Config)) *env {
	t.Helper()
	e := &env{logs: &syncBuffer{}, denied: make(chan Denial, 1024), ns: newSandboxNS(t)}
	cfg := Config{Hosts: testHosts, UpstreamRoots: testCAPool(t), Log: zerolog.New(e.logs).Level(zerolog.DebugLevel),
		OnDenied: func(d Denial) {
			select {
			case e.denied <- d:
			default:
			}
		}}
	for _, m := range mutate {
		m(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.p = p
	e.s, err = p.Attach(Attachment{ID: "t", NetNS: e.ns, Policy: mustParse(t, policy), Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustParse(t testing.TB, s string) Policy {
	t.Helper()
	p, err := Parse([]byte(s), "network")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// lookup asks the sandbox's resolver (any address on port 53 reaches it)
// for name's A records.
func (e *env) lookup(t testing.TB, name string) (dnsmessage.RCode, []netip.Addr) {
	t.Helper()
	q, err := dnsmessage.NewName(name + ".")
	if err != nil {
		t.Fatal(err)
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: q, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	msg, _ := b.Finish()
	resp, err := e.exchange(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("DNS %s: %v", name, err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(resp); err != nil {
		t.Fatal(err)
	}
	var addrs []netip.Addr
	for _, a := range m.Answers {
		if r, ok := a.Body.(*dnsmessage.AResource); ok {
			addrs = append(addrs, netip.AddrFrom4(r.A))
		}
	}
	return m.RCode, addrs
}

// dial connects from inside the sandbox; a host name goes through the
// sandbox's resolver.
func (e *env) dial(ctx context.Context, t testing.TB, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		rc, addrs := e.lookup(t, host)
		if rc != dnsmessage.RCodeSuccess || len(addrs) == 0 {
			return nil, fmt.Errorf("sandbox DNS for %s: %v", host, rc)
		}
		host = addrs[0].String()
	}
	var c net.Conn
	err = netns.Do(e.ns, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp4", net.JoinHostPort(host, port))
		return err
	})
	return c, err
}

// client is an HTTP client inside the sandbox trusting roots.
func (e *env) client(t testing.TB, roots *x509.CertPool) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:       func(ctx context.Context, _, addr string) (net.Conn, error) { return e.dial(ctx, t, addr) },
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DisableKeepAlives: true,
		},
	}
}

// get fetches url from the sandbox: the body, or an error.
func (e *env) get(t testing.TB, url string, header http.Header, roots *x509.CertPool) (string, http.Header, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := e.client(t, roots).Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), resp.Header, err
}

// server is a test server that counts the connections it accepted.
type server struct {
	accepted atomic.Int64
	open     atomic.Int64
	maxOpen  atomic.Int64
	seen     chan http.Header
}

type countingListener struct {
	net.Listener
	s *server
}

type trackedConn struct {
	net.Conn
	s    *server
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.s.open.Add(-1) })
	return c.Conn.Close()
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.s.accepted.Add(1)
		n := l.s.open.Add(1)
		for {
			m := l.s.maxOpen.Load()
			if n <= m || l.s.maxOpen.CompareAndSwap(m, n) {
				break
			}
		}
		c = &trackedConn{Conn: c, s: l.s}
	}
	return c, err
}

// startServer serves HTTP (TLS when cert is set) on addr: it answers its
// name and the Authorization and X-Token it got, echoes X-Token in a
// response header, and /redirect sends the client to location.
func startServer(t testing.TB, addr, name string, cert *tls.Certificate, location string) *server {
	t.Helper()
	s := &server{seen: make(chan http.Header, 64)}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	var l net.Listener = countingListener{ln, s}
	if cert != nil {
		l = tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{*cert}})
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case s.seen <- r.Header.Clone():
		default:
		}
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, location, http.StatusFound)
			return
		}
		if r.URL.Path == "/upgrade" {
			echoUpgrade(w)
			return
		}
		if r.URL.Path == "/bulk" {
			w.Header().Set("Content-Length", fmt.Sprint(bulkSize))
			_, _ = io.CopyN(w, zeros{}, bulkSize)
			return
		}
		w.Header().Set("X-Echo", r.Header.Get("X-Token"))
		fmt.Fprintf(w, "%s auth=%s token=%s", name, r.Header.Get("Authorization"), r.Header.Get("X-Token"))
	}), ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return s
}

const bulkSize = 256 << 20

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// testCA signs the test servers' certificates (the "public" PKI of the
// tests); built once.
var testCA = sync.OnceValues(func() (*sessionCA, error) { return newSessionCA("test servers", nil) })

func testCAPool(t testing.TB) *x509.CertPool {
	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

func testCert(t testing.TB, name string) *tls.Certificate {
	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ca.leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mustFail says what happened when a refused request got through.
func mustFail(t *testing.T, what string, body string, err error) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: got through: %q", what, body)
	}
}

func noConnections(t *testing.T, what string, s *server) {
	t.Helper()
	if n := s.accepted.Load(); n != 0 {
		t.Errorf("%s: the refused server saw %d connections", what, n)
	}
}

// echoUpgrade switches to a protocol that echoes what it gets.
func echoUpgrade(w http.ResponseWriter) {
	c, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	_ = rw.Flush()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, _ := rw.Read(buf)
	_, _ = c.Write(buf[:n])
}
