package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// handshakeTimeout bounds the TLS handshake the proxy serves.
const handshakeTimeout = 10 * time.Second

// forwardHTTP serves a connection to a host that carries secrets: request
// by request (HTTP/1.1, over TLS terminated with the session CA when the
// client spoke TLS), each request's Host must be the connection's name,
// its headers get the secrets' values in place of their placeholders, and
// it goes to the address the connection was decided for. A redirect is
// the client's next request, decided and rewritten on its own.
func (s *Session) forwardHTTP(ctx context.Context, client net.Conn, pk peeked, t target, secrets []sessionSecret) {
	idle := s.p.cfg.Limits.IdleTimeout
	var conn net.Conn = &idleConn{Conn: &countingConn{Conn: &prefixConn{Conn: client, prefix: pk.data}, c: s.stats}, idle: idle}
	scheme := "http"
	if pk.kind == kindTLS {
		tc := tls.Server(conn, &tls.Config{
			MinVersion: tls.VersionTLS12,
			NextProtos: []string{"http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return s.ca.leaf(t.name)
			},
		})
		hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			return
		}
		conn, scheme = tc, "https"
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return s.p.dial(ctx, t.dst)
		},
		TLSClientConfig:       &tls.Config{ServerName: t.name, RootCAs: s.p.cfg.UpstreamRoots, NextProtos: []string{"http/1.1"}},
		DisableCompression:    true,
		MaxIdleConnsPerHost:   1,
		IdleConnTimeout:       idle,
		ResponseHeaderTimeout: idle,
		TLSHandshakeTimeout:   handshakeTimeout,
	}
	defer tr.CloseIdleConnections()
	br := bufio.NewReader(conn)
	for ctx.Err() == nil {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if !s.forwardOne(ctx, br, conn, tr, req, scheme, t, secrets) {
			return
		}
	}
}

// forwardOne sends one request and writes its response; false ends the
// connection.
func (s *Session) forwardOne(ctx context.Context, br *bufio.Reader, conn net.Conn, tr *http.Transport, req *http.Request, scheme string, t target, secrets []sessionSecret) bool {
	if canonicalName(hostOnly(req.Host)) != t.name {
		// Another name on this connection would get this host's secrets.
		writeStatus(conn, http.StatusMisdirectedRequest)
		return false
	}
	insertSecrets(req.Header, secrets)
	insertSecretsInQuery(req.URL, secrets)
	req.URL.Scheme, req.URL.Host, req.RequestURI = scheme, req.Host, ""
	resp, err := tr.RoundTrip(req.WithContext(ctx))
	if err != nil {
		// The error can quote the request; it is not logged or passed on.
		writeStatus(conn, http.StatusBadGateway)
		return false
	}
	defer resp.Body.Close()
	secrets = scrubForms(secrets)
	scrubSecrets(resp.Header, secrets)
	scrubSecrets(resp.Trailer, secrets)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		upgraded(br, conn, resp)
		return false
	}
	if resp.ContentLength != 0 && resp.Body != http.NoBody && req.Method != http.MethodHead {
		// The scrubbed body's length is not known in advance.
		resp.Body = newScrubBody(resp.Body, secrets)
		resp.ContentLength, resp.TransferEncoding = -1, []string{"chunked"}
		resp.Header.Del("Content-Length")
	}
	if err := resp.Write(conn); err != nil {
		return false
	}
	return !req.Close && !resp.Close
}

func writeStatus(w net.Conn, code int) {
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", code, http.StatusText(code))
}

// idleConn ends a connection that moves no byte for idle.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c *idleConn) Read(b []byte) (int, error) {
	_ = c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}

// countingConn adds what passes to the session's byte counters.
type countingConn struct {
	net.Conn
	c *counters
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.c.bytesOut.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.c.bytesIn.Add(uint64(n))
	return n, err
}

// upgraded passes an upgraded connection (a WebSocket) through as it is,
// after the 101 head: frames are not searched for placeholders.
func upgraded(br *bufio.Reader, conn net.Conn, resp *http.Response) {
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		writeStatus(conn, http.StatusBadGateway)
		return
	}
	head := *resp
	head.Body = nil
	if err := head.Write(conn); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, br)
		up.Close()
	}()
	_, _ = io.Copy(conn, up)
	conn.Close()
	<-done
}
