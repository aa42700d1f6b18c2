package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/boxrt/boxrt/internal/netns"
)

// The egress tests run boxrt in a network namespace the test makes: its
// loopback carries the test servers' addresses (TEST-NET-3 and the
// metadata address), so nothing a session does can reach any other
// address, and egress.hosts names them. The proxy dials from boxrt's
// namespace, so a server reached through it saw a connection and one that
// was refused saw none.
const (
	egressAPI   = "203.0.113.10"
	egressOther = "203.0.113.20"
	egressBad   = "203.0.113.30"
	egressMeta  = "169.254.169.254"
)

// egressNet is a network namespace made for one test.
type egressNet struct{ ns *os.File }

func newEgressNet(t *testing.T) *egressNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the egress tests need root: boxrt attaches its proxy to sandbox namespaces")
	}
	type made struct {
		ns  *os.File
		err error
	}
	ch := make(chan made, 1)
	go func() {
		// The thread goes back to its namespace before it is unlocked: a
		// locked goroutine that ended elsewhere would wedge the main
		// thread there, and /proc/net (the main thread's) with it.
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- made{err: err}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ch <- made{err: err}
			return
		}
		ns, err := os.Open("/proc/thread-self/ns/net")
		if err == nil {
			err = egressLoopback()
		}
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- made{err: err} // the thread ends with the goroutine, still locked
			return
		}
		runtime.UnlockOSThread()
		ch <- made{ns, err}
	}()
	m := <-ch
	require.NoError(t, m.err)
	t.Cleanup(func() { m.ns.Close() })
	return &egressNet{ns: m.ns}
}

// egressLoopback brings lo up with the servers' addresses on it.
func egressLoopback() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	for _, a := range []string{egressAPI, egressOther, egressBad, egressMeta} {
		addr, _ := netlink.ParseAddr(a + "/32")
		if err := netlink.AddrAdd(lo, addr); err != nil {
			return err
		}
	}
	return nil
}

// run runs f on a thread of its own in the namespace (sockets it opens and
// processes it starts live there); the thread is discarded afterwards.
func (n *egressNet) run(t *testing.T, f func()) {
	t.Helper()
	require.NoError(t, n.do(f))
}

// do is run without a test: f's failure (runtime.Goexit) is an error.
func (n *egressNet) do(f func()) error {
	return netns.Do(n.ns, func() error { f(); return nil })
}

// client is an HTTP client that dials in the namespace.
func (n *egressNet) client() *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // no idle connection outlives the test
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			if derr := n.do(func() { conn, err = (&net.Dialer{}).DialContext(ctx, network, addr) }); derr != nil {
				return nil, derr
			}
			return conn, err
		},
	}}
}

// egressServer is an HTTP server in the test namespace that counts its
// requests and keeps their Authorization headers.
type egressServer struct {
	addr  string
	body  string
	hits  atomic.Int64
	mu    sync.Mutex
	auth  []string
	query []string
}

// serve starts an HTTP server on ip, HTTPS with cert when it is not nil.
func (n *egressNet) serve(t *testing.T, ip, body string, cert *tls.Certificate) *egressServer {
	t.Helper()
	s := &egressServer{body: body}
	var ln net.Listener
	var err error
	n.run(t, func() { ln, err = net.Listen("tcp4", ip+":0") })
	require.NoError(t, err)
	s.addr = ln.Addr().String()
	if cert != nil {
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*cert}})
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.mu.Lock()
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		s.query = append(s.query, r.URL.RawQuery)
		s.mu.Unlock()
		fmt.Fprintln(w, s.body)
	}), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return s
}

func (s *egressServer) port() string {
	_, p, _ := net.SplitHostPort(s.addr)
	return p
}

func (s *egressServer) auths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...)
}

func (s *egressServer) queries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.query...)
}

// egressEnv is a stdio boxrt on one backend in its own namespace, with
// its servers.
type egressEnv struct {
	n                           *egressNet
	p                           *Proc
	api, api2, other, bad, meta *egressServer
	apiTLS                      *egressServer
	opts                        Options // how p was started (restart)
}

// egressCA makes a CA (written to a file, for egress.upstream_ca_file)
// and a certificate it signs for name.
func egressCA(t *testing.T, name string) (string, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "boxrt egress test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644))
	return file, tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
}

// egressToken is the control token of the tests' boxrt (/metrics).
const egressToken = "egress-test-token-0123456789abcdef"

const egressHosts = `{"api.test":"` + egressAPI + `","other.test":"` + egressOther + `","bad.test":"` + egressBad + `"}`

func newEgressEnv(t *testing.T, backend string) *egressEnv {
	t.Helper()
	e := &egressEnv{n: newEgressNet(t)}
	e.api = e.n.serve(t, egressAPI, "api", nil)
	e.api2 = e.n.serve(t, egressAPI, "api other port", nil)
	e.other = e.n.serve(t, egressOther, "other", nil)
	e.bad = e.n.serve(t, egressBad, "bad", nil)
	e.meta = e.n.serve(t, egressMeta, "meta", nil)
	caFile, cert := egressCA(t, "api.test")
	e.apiTLS = e.n.serve(t, egressAPI, "api over tls", &cert)
	cfg := "{" + backendConfigs[backend] + `,"egress":{"hosts":` + egressHosts + `,"upstream_ca_file":"` + caFile + `"}}`
	e.opts = Options{Stdio: true, Config: cfg, HTTP: e.n.client(), Env: []string{"BOXRT_CONTROL_TOKEN=" + egressToken}, StateDir: t.TempDir()}
	e.n.run(t, func() { e.p = Start(t, e.opts) })
	return e
}

// restart kills boxrt (SIGKILL) and starts it again on its state directory.
func (e *egressEnv) restart(t *testing.T) {
	e.p.Kill()
	e.n.run(t, func() { e.p = Start(t, e.opts) })
}

// fetchPy is a client that ignores HTTP(S)_PROXY: it connects to the
// address the sandbox's resolver gives (argv: url, then headers).
const fetchPy = `import sys, urllib.request as u
r = u.Request(sys.argv[1])
for h in sys.argv[2:]:
    r.add_header(*h.split(": ", 1))
o = u.build_opener(u.ProxyHandler({}))
sys.stdout.write(o.open(r, timeout=5).read().decode())`

// fetchCmd fetches url with python3 (bwrap's host root and the docker
// sandbox image have it), sending header when not empty (the shell
// expands it); it prints the body or fails.
func fetchCmd(url, header string) string {
	cmd := fmt.Sprintf("python3 -c '%s' %s", fetchPy, url)
	if header != "" {
		cmd += fmt.Sprintf(` "%s"`, header)
	}
	return cmd + " 2>/dev/null"
}

// resolveCmd resolves name with the sandbox's resolver.
func resolveCmd(name string) string { return "getent hosts " + name }

type egressExec struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

func (e *egressEnv) exec(t *testing.T, spec map[string]any, cmd string) egressExec {
	t.Helper()
	params := map[string]any{"cmd": cmd, "timeout_sec": 60}
	for k, v := range spec {
		params[k] = v
	}
	var r egressExec
	e.call(t, "box_exec", params, &r)
	return r
}

// call is Proc.MustCall failing t, the caller's (sub)test.
func (e *egressEnv) call(t *testing.T, method string, params, out any) {
	t.Helper()
	r := e.p.Call(method, params, 2*time.Minute)
	require.Nil(t, r.Error, "%s: %+v", method, r.Error)
	if out != nil {
		require.NoError(t, json.Unmarshal(r.Result, out))
	}
}

func TestEgress(t *testing.T) {
	// docker-default: boxrt-sandbox:latest has python3.
	for _, backend := range []string{"bwrap", "docker-default"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := newEgressEnv(t, backend)
			t.Run("policy", func(t *testing.T) { testEgressPolicy(t, e) })
			t.Run("on", func(t *testing.T) { testEgressOn(t, e) })
			t.Run("update", func(t *testing.T) { testEgressUpdate(t, e) })
			t.Run("flood", func(t *testing.T) { testEgressFlood(t, e) })
			t.Run("suspend", func(t *testing.T) { testEgressSuspend(t, e) })
			// Last: it restarts boxrt, which ends the other sessions.
			t.Run("update survives a restart", func(t *testing.T) { testEgressUpdateRestart(t, e) })
		})
	}
}

// testEgressPolicy: the allowed name and port are reachable and carry the
// secret; every other way out is refused before any server sees it; the
// sandbox holds only the placeholder; the counters and notifications say
// what happened.
func testEgressPolicy(t *testing.T, e *egressEnv) {
	const secret, querySecret = "sk-egress-test-5f1b0c2a9d", "qk egress&test"
	spec := map[string]any{
		"session_id": "policy",
		"network":    map[string]any{"allow": []string{"api.test:" + e.api.port(), "api.test:" + e.apiTLS.port(), "bad.test"}, "deny": []string{egressBad}},
		"secrets": []map[string]any{{"name": "API_TOKEN", "value": secret, "hosts": []string{"api.test"}},
			{"name": "API_KEY", "value": querySecret, "hosts": []string{"api.test"}, "query": true}},
	}
	r := e.exec(t, spec, fetchCmd("http://api.test:"+e.api.port()+"/", `Authorization: Bearer $API_TOKEN`))
	require.Equal(t, 0, r.ExitCode, "allowed name: %+v", r)
	assert.Equal(t, "api\n", r.Stdout)
	assert.Equal(t, []string{"Bearer " + secret}, e.api.auths(), "the secret arrives at its host")
	// HTTPS: the proxy terminates TLS for the secret's host with the
	// session's CA, which the sandbox's bundle (SSL_CERT_FILE) trusts.
	r = e.exec(t, spec, fetchCmd("https://api.test:"+e.apiTLS.port()+"/", `Authorization: Bearer $API_TOKEN`))
	require.Equal(t, 0, r.ExitCode, "allowed name over TLS: %+v", r)
	assert.Equal(t, "api over tls\n", r.Stdout)
	assert.Equal(t, []string{"Bearer " + secret}, e.apiTLS.auths(), "the secret arrives at its host over TLS")
	// A secret configured for query strings arrives there, URL-encoded; the
	// header-only one stays a placeholder in a query.
	r = e.exec(t, spec, fetchCmd(`"https://api.test:`+e.apiTLS.port()+`/?key=$API_KEY&tok=$API_TOKEN"`, ""))
	require.Equal(t, 0, r.ExitCode, "query secret over TLS: %+v", r)
	if q := e.apiTLS.queries(); assert.Len(t, q, 2) {
		v, err := url.ParseQuery(q[1])
		require.NoError(t, err)
		assert.Equal(t, querySecret, v.Get("key"), "the query secret at its host")
		assert.True(t, strings.HasPrefix(v.Get("tok"), "boxrt-secret-"), "a header-only secret went into a query: %q", q[1])
	}

	refused := map[string]string{
		"other port of the allowed name": fetchCmd("http://api.test:"+e.api2.port()+"/", ""),
		"other name":                     fetchCmd("http://other.test:"+e.other.port()+"/", ""),
		"raw IP":                         fetchCmd("http://"+e.other.addr+"/", ""),
		"name of a denied address":       fetchCmd("http://bad.test:"+e.bad.port()+"/", ""),
		"metadata":                       fetchCmd("http://"+e.meta.addr+"/", ""),
		"loopback":                       fetchCmd("http://127.0.0.1:"+e.api.port()+"/", ""),
	}
	for what, cmd := range refused {
		r := e.exec(t, spec, cmd)
		assert.NotEqual(t, 0, r.ExitCode, "%s reached: %+v", what, r)
	}
	for _, s := range []*egressServer{e.api2, e.other, e.bad, e.meta} {
		assert.Zero(t, s.hits.Load(), "%s saw a refused connection", s.body)
	}
	assert.EqualValues(t, 1, e.api.hits.Load(), "the api server's requests")

	r = e.exec(t, spec, resolveCmd("other.test"))
	assert.NotEqual(t, 0, r.ExitCode, "DNS answered a denied name: %+v", r)
	r = e.exec(t, spec, resolveCmd("api.test"))
	assert.Contains(t, r.Stdout, egressAPI, "DNS of the allowed name: %+v", r)

	// No trace of the value: environment, every process's environ, the
	// writable places and the trust bundle. The pattern is split so that
	// no command line carries it.
	half := len(secret) / 2
	r = e.exec(t, spec, fmt.Sprintf(`a=%s; b=%s; env | grep -c "$a$b"; grep -rlsF "$a$b" /proc/[0-9]*/environ /tmp /home /workspace /etc /run; test "$API_TOKEN" != "$a$b" && echo placeholder`,
		secret[:half], secret[half:]))
	assert.Equal(t, "0\nplaceholder\n", r.Stdout, "the sandbox holds the secret: %+v", r)

	var info struct {
		Network struct {
			Policy  json.RawMessage `json:"policy"`
			Allowed []struct {
				Name string `json:"name"`
			} `json:"allowed"`
			Denied []struct {
				Name string `json:"name"`
			} `json:"denied"`
		} `json:"network"`
	}
	e.call(t, "box_get_session", map[string]any{"session_id": "policy"}, &info)
	require.NotEmpty(t, info.Network.Allowed, "box_get_session's network: %+v", info.Network)
	assert.Equal(t, "api.test", info.Network.Allowed[0].Name)
	assert.GreaterOrEqual(t, len(info.Network.Denied), 4, "denied rows: %+v", info.Network.Denied)

	// Denials reach the caller of the box_exec as notifications.
	drainLines(e.p)
	e.exec(t, spec, fetchCmd("http://other.test:"+e.other.port()+"/", ""))
	assert.Contains(t, networkEvents(e.p), "other.test", "box_network_event for the refused name")

	assert.NotContains(t, e.p.Stderr(), secret, "the secret in boxrt's log")

	req, _ := http.NewRequest("GET", "http://"+e.p.Addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+egressToken)
	resp, err := e.n.client().Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	metrics := string(body)
	assert.NotContains(t, metrics, secret)
	assert.NotContains(t, metrics, "other.test", "a name in a metric label")
	for _, series := range []string{`boxrt_egress_connections_total{decision="allowed"}`, `boxrt_egress_connections_total{decision="denied"}`, `boxrt_egress_bytes_total{direction="in"}`} {
		v := metricValue(t, metrics, series)
		assert.NotContains(t, []string{"", "0"}, v, "%s", series)
	}
}

// testEgressOn: "on" reaches neither the metadata address nor the host's
// own addresses (which the proxy treats like its loopback).
func testEgressOn(t *testing.T, e *egressEnv) {
	spec := map[string]any{"session_id": "on", "network": "on"}
	before := e.api.hits.Load()
	for _, url := range []string{"http://" + e.meta.addr + "/", "http://" + e.api.addr + "/", "http://10.0.2.2:" + e.api.port() + "/"} {
		r := e.exec(t, spec, fetchCmd(url, ""))
		assert.NotEqual(t, 0, r.ExitCode, "network on reached %s: %+v", url, r)
	}
	assert.Zero(t, e.meta.hits.Load(), "the metadata server saw a connection")
	assert.Equal(t, before, e.api.hits.Load(), "the host's own address saw a connection")
}

// testEgressUpdate: box_update_network opens and closes a running
// session's way out; a session made with network off has none to change.
func testEgressUpdate(t *testing.T, e *egressEnv) {
	spec := map[string]any{"session_id": "live", "network": map[string]any{"allow": []string{}}}
	fetch := fetchCmd("http://other.test:"+e.other.port()+"/", "")
	r := e.exec(t, spec, fetch)
	require.NotEqual(t, 0, r.ExitCode, "reached before the update: %+v", r)

	allow := map[string]any{"allow": []string{"other.test"}}
	e.call(t, "box_update_network", map[string]any{"session_id": "live", "network": allow}, nil)
	spec["network"] = allow // the session's spec is its policy now
	r = e.exec(t, spec, fetch)
	assert.Equal(t, "other\n", r.Stdout, "after opening: %+v", r)

	e.call(t, "box_update_network", map[string]any{"session_id": "live", "network": "off"}, nil)
	spec["network"] = map[string]any{"allow": []string{}}
	r = e.exec(t, spec, fetch)
	assert.NotEqual(t, 0, r.ExitCode, "reached after closing: %+v", r)
	assert.EqualValues(t, 1, e.other.hits.Load(), "the other server's requests")

	e.exec(t, map[string]any{"session_id": "no-net"}, "true")
	resp := e.p.Call("box_update_network", map[string]any{"session_id": "no-net", "network": "on"}, time.Minute)
	require.NotNil(t, resp.Error)
	assert.Equal(t, "BoxValidationError", resp.Error.Type())
	resp = e.p.Call("box_update_network", map[string]any{"session_id": "live", "network": map[string]any{"allow": []string{"*."}}}, time.Minute)
	require.NotNil(t, resp.Error)
	assert.Equal(t, "BoxValidationError", resp.Error.Type())
	assert.Contains(t, resp.Error.Message, "network.allow[0]")
}

// testEgressUpdateRestart: what a persistent session's egress was given
// is what it has after boxrt is killed and restarted: the policy its last
// box_update_network set (opened, then closed again), and its secrets
// (same placeholder in its environment, the value still put in its
// requests, over TLS too with the CA its bundle trusts).
func testEgressUpdateRestart(t *testing.T, e *egressEnv) {
	const secret = "sk-kept-over-restart-77f3"
	api := []string{"api.test:" + e.api.port(), "api.test:" + e.apiTLS.port()}
	closed := map[string]any{"allow": api}
	open := map[string]any{"allow": append([]string{"other.test"}, api...)}
	spec := map[string]any{"session_id": "kept", "persistent": true, "network": closed,
		"secrets": []map[string]any{{"name": "API_TOKEN", "value": secret, "hosts": []string{"api.test"}}}}
	fetch := fetchCmd("http://other.test:"+e.other.port()+"/", "")
	require.NotEqual(t, 0, e.exec(t, spec, fetch).ExitCode, "reached before the update")
	placeholder := e.exec(t, spec, `echo "$API_TOKEN"`).Stdout
	require.Contains(t, placeholder, "boxrt-secret-")
	policy := func() string {
		var info struct {
			Network struct {
				Policy json.RawMessage `json:"policy"`
			} `json:"network"`
		}
		e.call(t, "box_get_session", map[string]any{"session_id": "kept"}, &info)
		return string(info.Network.Policy)
	}

	e.call(t, "box_update_network", map[string]any{"session_id": "kept", "network": open}, nil)
	e.restart(t)
	want, _ := json.Marshal(open)
	assert.JSONEq(t, string(want), policy(), "the policy after a restart")
	spec["network"] = open
	assert.Equal(t, "other\n", e.exec(t, spec, fetch).Stdout, "opened, then restarted")
	assert.Equal(t, placeholder, e.exec(t, spec, `echo "$API_TOKEN"`).Stdout, "the placeholder after a restart")
	apiSeen, tlsSeen := len(e.api.auths()), len(e.apiTLS.auths())
	r := e.exec(t, spec, fetchCmd("http://api.test:"+e.api.port()+"/", `Authorization: Bearer $API_TOKEN`))
	assert.Equal(t, "api\n", r.Stdout, "%+v", r)
	r = e.exec(t, spec, fetchCmd("https://api.test:"+e.apiTLS.port()+"/", `Authorization: Bearer $API_TOKEN`))
	assert.Equal(t, "api over tls\n", r.Stdout, "%+v", r)
	if a := e.api.auths(); assert.Len(t, a, apiSeen+1) {
		assert.Equal(t, "Bearer "+secret, a[apiSeen], "the secret after a restart")
	}
	if a := e.apiTLS.auths(); assert.Len(t, a, tlsSeen+1) {
		assert.Equal(t, "Bearer "+secret, a[tlsSeen], "the secret over TLS after a restart")
	}

	e.call(t, "box_update_network", map[string]any{"session_id": "kept", "network": closed}, nil)
	e.restart(t)
	spec["network"] = closed
	assert.NotEqual(t, 0, e.exec(t, spec, fetch).ExitCode, "closed, then restarted: reached")
	e.call(t, "box_delete_session", map[string]any{"session_id": "kept"}, nil)
}

// floodPy opens argv[3] connections to argv[1]:argv[2] at once, sends a
// request on each, holds them 2 s, and prints how many were answered.
const floodPy = `import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    try:
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(b"GET / HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
        socks.append(s)
    except OSError:
        pass
answered = 0
for s in socks:
    try:
        if s.recv(12).startswith(b"HTTP/1.1 200"):
            answered += 1
    except OSError:
        pass
time.sleep(2)
print(answered)`

// testEgressFlood: a connection flood from inside gets no more than the
// per-session limit (256) through; the rest are refused and reported, and
// the session's network works again afterwards.
func testEgressFlood(t *testing.T, e *egressEnv) {
	spec := map[string]any{"session_id": "flood", "network": map[string]any{"allow": []string{"api.test"}}}
	drainLines(e.p)
	r := e.exec(t, spec, fmt.Sprintf("python3 -c '%s' api.test %s 400", floodPy, e.api.port()))
	require.Equal(t, 0, r.ExitCode, "%+v", r)
	var answered int
	_, err := fmt.Sscan(r.Stdout, &answered)
	require.NoError(t, err, "%+v", r)
	t.Logf("%d of 400 connections answered", answered)
	assert.Greater(t, answered, 0)
	assert.LessOrEqual(t, answered, 256, "connections through at once")
	assert.Contains(t, networkEvents(e.p), "connection limit")
	r = e.exec(t, spec, fetchCmd("http://api.test:"+e.api.port()+"/", ""))
	assert.Equal(t, "api\n", r.Stdout, "after the flood: %+v", r)
}

// testEgressSuspend: a suspended session's network is detached from the
// proxy and attached again, with the policy in force, when it resumes.
func testEgressSuspend(t *testing.T, e *egressEnv) {
	spec := map[string]any{"session_id": "durable", "network": map[string]any{"allow": []string{"other.test"}}}
	fetch := fetchCmd("http://other.test:"+e.other.port()+"/", "")
	require.Equal(t, "other\n", e.exec(t, spec, fetch).Stdout)
	attached := func() bool {
		var info struct {
			Network struct {
				Attached bool `json:"attached"`
			} `json:"network"`
		}
		e.call(t, "box_get_session", map[string]any{"session_id": "durable"}, &info)
		return info.Network.Attached
	}
	require.True(t, attached())
	e.call(t, "box_suspend_session", map[string]any{"session_id": "durable"}, nil)
	assert.False(t, attached(), "a suspended session is still attached")
	e.call(t, "box_resume_session", map[string]any{"session_id": "durable"}, nil)
	assert.Equal(t, "other\n", e.exec(t, spec, fetch).Stdout, "after the resume")
	assert.True(t, attached())
}

// drainLines discards the stdout lines no call waited for so far.
func drainLines(p *Proc) {
	for {
		select {
		case <-p.lines:
		default:
			return
		}
	}
}

// networkEvents returns the box_network_event notifications read so far,
// as text.
func networkEvents(p *Proc) string {
	var out []string
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(string(l), `"box_network_event"`) {
				out = append(out, string(l))
			}
		default:
			return strings.Join(out, "\n")
		}
	}
}
