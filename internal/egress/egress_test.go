package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestPolicyEnforced(t *testing.T) {
	api := startServer(t, apiAddr+":8080", "api", nil, "")
	api9090 := startServer(t, apiAddr+":9090", "api9090", nil, "")
	other := startServer(t, otherAddr+":8080", "other", nil, "")
	bad := startServer(t, badAddr+":8080", "bad", nil, "")
	hostLo := startServer(t, "127.0.0.1:8080", "host loopback", nil, "")
	e := newEnv(t, `{"allow":["api.test:8080","bad.test","localhost"],"deny":["203.0.113.30"]}`, nil)

	// Before any DNS answer, the address alone is not allowed.
	body, _, err := e.get(t, "http://"+apiAddr+":8080/", nil, nil)
	mustFail(t, "raw IP of an allowed name", body, err)
	if api.accepted.Load() != 0 {
		t.Fatalf("raw IP reached the server")
	}

	body, _, err = e.get(t, "http://api.test:8080/", nil, nil)
	if err != nil || !strings.HasPrefix(body, "api ") {
		t.Fatalf("allowed name and port: %q, %v", body, err)
	}

	// A TLS ClientHello naming another host, to the allowed address and port.
	seen := api.accepted.Load()
	c, err := e.dial(context.Background(), t, apiAddr+":8080")
	if err != nil {
		t.Fatal(err)
	}
	if err := tlsClient(c, "other.test", nil).Handshake(); err == nil {
		t.Error("TLS with another name's SNI got through")
	}
	c.Close()
	if api.accepted.Load() != seen {
		t.Error("TLS with another name's SNI reached the server")
	}

	body, _, err = e.get(t, "http://api.test:9090/", nil, nil)
	mustFail(t, "other port of the allowed name", body, err)
	noConnections(t, "other port", api9090)

	if rc, addrs := e.lookup(t, "other.test"); rc != dnsmessage.RCodeRefused || len(addrs) != 0 {
		t.Errorf("DNS for a name the policy does not allow: %v %v", rc, addrs)
	}
	body, _, err = e.get(t, "http://"+otherAddr+":8080/", nil, nil)
	mustFail(t, "raw IP", body, err)
	req := "GET / HTTP/1.1\r\nHost: other.test:8080\r\n\r\n"
	refused(t, "other name at its address", e, otherAddr+":8080", req)
	noConnections(t, "other name", other)

	// bad.test is allowed, but its address is denied.
	if rc, addrs := e.lookup(t, "bad.test"); rc != dnsmessage.RCodeRefused || len(addrs) != 0 {
		t.Errorf("DNS for a name whose address is denied: %v %v", rc, addrs)
	}
	refused(t, "name resolving to a denied address", e, badAddr+":8080", "GET / HTTP/1.1\r\nHost: bad.test:8080\r\n\r\n")
	noConnections(t, "denied address", bad)

	// localhost is allowed by name, but resolves to loopback: no rule names
	// 127.0.0.1, so neither DNS nor a Host header gets there.
	if rc, addrs := e.lookup(t, "localhost"); rc != dnsmessage.RCodeRefused || len(addrs) != 0 {
		t.Errorf("DNS for a name on loopback: %v %v", rc, addrs)
	}
	refused(t, "Host: localhost", e, apiAddr+":8080", "GET / HTTP/1.1\r\nHost: localhost:8080\r\n\r\n")
	noConnections(t, "host loopback", hostLo)

	// The proxy's own port, dialled directly, is no way out.
	refused(t, "the proxy's port", e, e.s.l.tcp.Addr().String(), req)

	st := e.s.Stats()
	if len(st.Allowed) != 1 || st.Allowed[0] != (Count{Name: "api.test", Port: 8080, Count: 1}) {
		t.Errorf("allowed counters: %+v", st.Allowed)
	}
	if len(st.Denied) < 5 || st.BytesOut == 0 || st.BytesIn == 0 {
		t.Errorf("counters: %+v", st)
	}
	if len(e.denied) == 0 {
		t.Errorf("no denial reached the callback")
	}
}

func TestOnKeepsPrivateAddressesClosed(t *testing.T) {
	meta := startServer(t, metaAddr+":80", "metadata", nil, "")
	api := startServer(t, apiAddr+":8080", "api", nil, "")
	e := newEnv(t, `"on"`, nil)
	body, _, err := e.get(t, "http://"+metaAddr+"/latest/meta-data/", nil, nil)
	mustFail(t, "metadata address under on", body, err)
	noConnections(t, "metadata", meta)
	body, _, err = e.get(t, "http://"+apiAddr+":8080/", nil, nil)
	mustFail(t, "the host's own address under on", body, err)
	if api.accepted.Load() != 0 {
		t.Fatal("the host's own address was reached")
	}
	// A name the operator maps is named by the operator.
	body, _, err = e.get(t, "http://api.test:8080/", nil, nil)
	if err != nil || !strings.HasPrefix(body, "api ") {
		t.Fatalf("operator-mapped name under on: %q, %v", body, err)
	}
}

func refused(t *testing.T, what string, e *env, addr, req string) {
	t.Helper()
	body, err := rawRequest(t, e, addr, req)
	mustFail(t, what, body, err)
}

// rawRequest sends one request from the sandbox to addr and reads the
// answer; the error says the connection was refused or closed.
func rawRequest(t *testing.T, e *env, addr, req string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := e.dial(ctx, t, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b), err
}

const secretValue = "sk-live-0123456789abcdef-never-in-the-sandbox"

func TestSecretsReachOnlyTheirHost(t *testing.T) {
	api := startServer(t, apiAddr+":8080", "api", nil, "http://other.test:8080/")
	other := startServer(t, otherAddr+":8080", "other", nil, "")
	apiTLS := startServer(t, apiAddr+":8443", "api-tls", testCert(t, "api.test"), "")
	otherTLS := startServer(t, otherAddr+":8443", "other-tls", testCert(t, "other.test"), "")
	e := newEnv(t, `{"allow":["api.test","other.test"]}`, []Secret{{Name: "API_TOKEN", Value: secretValue, Hosts: []string{"api.test"}}})
	ph := e.s.Env()["API_TOKEN"]
	if ph == "" || strings.Contains(ph, secretValue) {
		t.Fatalf("placeholder %q", ph)
	}
	bundle, err := e.s.CABundle()
	if err != nil || !bytes.HasSuffix(bundle, e.s.CAPEM()) || !(len(bundle) > len(e.s.CAPEM())) {
		t.Errorf("the bundle is not the host's roots followed by the session CA (%d bytes, %v)", len(bundle), err)
	}
	hdr := http.Header{"Authorization": {"Bearer " + ph}, "X-Token": {ph}}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(e.s.CAPEM()) {
		t.Fatal("session CA PEM does not parse")
	}
	roots.AddCert(must(testCA()).cert)

	for _, c := range []struct {
		url, want string
		srv       *server
		header    string
	}{
		{"http://api.test:8080/", secretValue, api, ""},
		{"https://api.test:8443/", secretValue, apiTLS, ""},
		{"http://other.test:8080/", ph, other, ""},
		{"https://other.test:8443/", ph, otherTLS, ""},
	} {
		body, respHdr, err := e.get(t, c.url, hdr, roots)
		if err != nil {
			t.Fatalf("%s: %v", c.url, err)
		}
		seen := <-c.srv.seen
		if got := seen.Get("Authorization"); got != "Bearer "+c.want {
			t.Errorf("%s: server got Authorization %q, want the %s", c.url, got, map[bool]string{true: "value", false: "placeholder"}[c.want == secretValue])
		}
		if strings.Contains(body, secretValue) || strings.Contains(respHdr.Get("X-Echo"), secretValue) {
			t.Errorf("%s: the value came back into the sandbox: %q %q", c.url, body, respHdr.Get("X-Echo"))
		}
	}

	// An upgrade (a WebSocket) to the secret's host gets the value in its
	// request head, then passes through.
	up, err := e.dial(context.Background(), t, "api.test:8080")
	if err != nil {
		t.Fatal(err)
	}
	_ = up.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(up, "GET /upgrade HTTP/1.1\r\nHost: api.test:8080\r\nConnection: Upgrade\r\nUpgrade: echo\r\nAuthorization: Bearer "+ph+"\r\n\r\nping")
	upr := bufio.NewReader(up)
	resp, err := http.ReadResponse(upr, nil)
	echo := make([]byte, 4)
	if err == nil {
		_, err = io.ReadFull(upr, echo)
	}
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols || string(echo) != "ping" {
		t.Errorf("upgrade: %v %q", err, echo)
	}
	up.Close()
	if auth := (<-api.seen).Get("Authorization"); auth != "Bearer "+secretValue {
		t.Errorf("upgrade request carried %q", auth)
	}

	// The redirect to another host is the client's own request: it
	// carries the placeholder.
	body, _, err := e.get(t, "http://api.test:8080/redirect", http.Header{"X-Token": {ph}}, roots)
	if err != nil || !strings.HasPrefix(body, "other ") {
		t.Fatalf("redirect: %q %v", body, err)
	}
	<-api.seen
	if got := (<-other.seen).Get("X-Token"); got != ph {
		t.Errorf("after a redirect the other host got X-Token %q", got)
	}

	// TLS to the other host is not terminated: the client sees the
	// server's own certificate.
	c, err := e.dial(context.Background(), t, "other.test:8443")
	if err != nil {
		t.Fatal(err)
	}
	tc := tlsClient(c, "other.test", roots)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if issuer := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; !strings.Contains(issuer, "test servers") {
		t.Errorf("TLS to a host without a secret was terminated (issuer %q)", issuer)
	}
	tc.Close()

	st, _ := json.Marshal(e.s.Stats())
	for what, text := range map[string]string{"stats": string(st), "logs": e.logs.String()} {
		if strings.Contains(text, secretValue) {
			t.Errorf("the value is in the %s", what)
		}
	}
}

func TestUpdateOpensAndClosesLive(t *testing.T) {
	startServer(t, apiAddr+":8080", "api", nil, "")
	e := newEnv(t, `{"allow":["api.test:8080"]}`, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.dial(ctx, t, "api.test:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	roundTrip := func() error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: api.test:8080\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	e.s.Update(mustParse(t, `{"allow":["other.test"]}`))
	if err := roundTrip(); err == nil {
		t.Fatal("a connection the new policy denies stayed open")
	}
	body, _, err := e.get(t, "http://api.test:8080/", nil, nil)
	mustFail(t, "after closing update", body, err)

	e.s.Update(mustParse(t, `{"allow":["api.test:8080"]}`))
	if body, _, err := e.get(t, "http://api.test:8080/", nil, nil); err != nil {
		t.Fatalf("after opening update: %q %v", body, err)
	}
}

func TestConnectionFloodHitsTheLimit(t *testing.T) {
	const limit = 16
	api := startServer(t, apiAddr+":8080", "api", nil, "")
	e := newEnv(t, `{"allow":["api.test:8080"]}`, nil, func(c *Config) { c.Limits.SessionConns = limit })
	if rc, _ := e.lookup(t, "api.test"); rc != dnsmessage.RCodeSuccess {
		t.Fatal(rc)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 8*limit; i++ {
		c, err := e.dial(context.Background(), t, apiAddr+":8080")
		if err != nil {
			continue
		}
		conns = append(conns, c)
		// Raw bytes: no name, decided by the DNS answer.
		_, _ = c.Write([]byte("\x00"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for api.accepted.Load() < limit && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := api.maxOpen.Load(); got > limit || got == 0 {
		t.Errorf("the server saw %d connections at once, limit %d", got, limit)
	}
	if a := e.s.Stats().Active; a > limit {
		t.Errorf("%d active connections, limit %d", a, limit)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	deadline = time.Now().Add(10 * time.Second)
	for e.s.Stats().Active > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if body, _, err := e.get(t, "http://api.test:8080/", nil, nil); err != nil {
		t.Fatalf("after the flood: %q %v", body, err)
	}
	limited := 0
	for len(e.denied) > 0 {
		if d := <-e.denied; d.Reason == reasonLimit && d.Name == "" && d.Port == 8080 {
			limited++
		}
	}
	if limited == 0 {
		t.Errorf("no connection was reported as refused by the limit")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestIdleTimeoutCountsBothDirections(t *testing.T) {
	const idle = 500 * time.Millisecond
	startRawServer(t, apiAddr+":7070", func(c net.Conn) {
		// Read what the client sent: closing with unread bytes would
		// reset the connection and lose the last bytes sent.
		if _, err := c.Read(make([]byte, 1)); err != nil {
			return
		}
		for i := 0; i < 12; i++ {
			time.Sleep(idle / 4)
			if _, err := c.Write([]byte{'.'}); err != nil {
				return
			}
		}
	})
	startRawServer(t, apiAddr+":7071", func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	e := newEnv(t, `{"allow":["api.test"]}`, nil, func(c *Config) { c.Limits.IdleTimeout = idle })
	e.lookup(t, "api.test")

	// The sandbox sends one byte, then only receives, for 3 idle periods.
	c, err := e.dial(context.Background(), t, apiAddr+":7070")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("x"))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ := io.ReadAll(c)
	if len(got) != 12 {
		t.Errorf("a download with a quiet upload direction was cut after %d bytes", len(got))
	}

	// Nothing either way: the proxy ends it within a few idle periods.
	c2, err := e.dial(context.Background(), t, apiAddr+":7071")
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = c2.Write([]byte("x"))
	start := time.Now()
	_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c2); err != nil {
		t.Errorf("idle connection: %v", err)
	}
	if d := time.Since(start); d > 5*idle {
		t.Errorf("an idle connection lived %v with idle timeout %v", d, idle)
	}
}

// startRawServer serves each TCP connection on addr with serve.
func startRawServer(t *testing.T, addr string, serve func(net.Conn)) {
	t.Helper()
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
}

func TestClosedSessionStaysCutOff(t *testing.T) {
	api := startServer(t, apiAddr+":8080", "api", nil, "")
	e := newEnv(t, `{"allow":["api.test:8080"]}`, nil)
	if body, _, err := e.get(t, "http://api.test:8080/", nil, nil); err != nil {
		t.Fatalf("%q %v", body, err)
	}
	e.s.Close()
	e.s.Close() // twice is fine
	if _, err := e.exchange([]byte("\x00\x07\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03api\x04test\x00\x00\x01\x00\x01"), 500*time.Millisecond); err == nil {
		t.Error("DNS answered after Close")
	}
	seen := api.accepted.Load()
	body, err := rawRequest(t, e, apiAddr+":8080", "GET / HTTP/1.1\r\nHost: api.test:8080\r\n\r\n")
	mustFail(t, "after Close", body, err)
	if api.accepted.Load() != seen {
		t.Error("a closed session's sandbox reached the server")
	}
}

func TestProxyWideConnectionLimit(t *testing.T) {
	startRawServer(t, apiAddr+":7070", func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	e := newEnv(t, `{"allow":["api.test"]}`, nil, func(c *Config) { c.Limits.Conns = 4 })
	e2 := &env{p: e.p, ns: newSandboxNS(t)}
	var err error
	if e2.s, err = e.p.Attach(Attachment{ID: "t2", NetNS: e2.ns, Policy: mustParse(t, `{"allow":["api.test"]}`)}); err != nil {
		t.Fatal(err)
	}
	for _, env := range []*env{e, e2} {
		if rc, _ := env.lookup(t, "api.test"); rc != dnsmessage.RCodeSuccess {
			t.Fatal(rc)
		}
	}
	for i := 0; i < 4; i++ {
		c, err := e.dial(context.Background(), t, apiAddr+":7070")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = c.Write([]byte("x"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.s.Stats().Active < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// The proxy is full: the other session's connection is refused.
	// (The reset can come before the dial returns.)
	if c, err := e2.dial(context.Background(), t, apiAddr+":7070"); err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a connection beyond the proxy's limit was kept: %v", err)
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(e2.s.Stats().Denied) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d := e2.s.Stats().Denied; len(d) != 1 || d[0].Name != apiAddr || d[0].Port != 7070 {
		t.Errorf("denied counters: %+v", d)
	}
}

// TestSessionLookupAndTotals: the proxy finds an attached session by its
// tag, and its totals count decisions across sessions, closed ones too.
func TestSessionLookupAndTotals(t *testing.T) {
	e := newEnv(t, `{"allow":[]}`, nil)
	if e.p.Session("t") != e.s || e.p.Session("nope") != nil {
		t.Fatal("Session does not find the attached session by its tag")
	}
	if rc, _ := e.lookup(t, "api.test"); rc != dnsmessage.RCodeRefused {
		t.Fatalf("DNS of a name the policy does not allow: %v", rc)
	}
	if tot := e.p.Totals(); tot.Denied != 1 || tot.Allowed != 0 || tot.Sessions != 1 {
		t.Fatalf("totals %+v, want one denial of one session", tot)
	}
	e.s.Close()
	if tot := e.p.Totals(); tot.Denied != 1 || tot.Sessions != 0 || e.p.Session("t") != nil {
		t.Fatalf("totals after the close %+v, want the denial kept and no session", tot)
	}
}
