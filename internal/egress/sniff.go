package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// kind is what the first bytes of a connection look like.
type kind int

const (
	kindRaw kind = iota
	kindTLS
	kindHTTP
)

// peeked is what the proxy read before deciding: the bytes (sent upstream
// first) and the name they carry, if any.
type peeked struct {
	data []byte
	kind kind
	name string
}

// peek reads from c until it holds a whole TLS ClientHello or HTTP/1
// request head, at most max bytes and wait time; a client that sends
// nothing first (a server-speaks-first protocol) costs wait once.
func peek(c net.Conn, max int, wait time.Duration) peeked {
	var pk peeked
	buf := make([]byte, max)
	n := 0
	_ = c.SetReadDeadline(time.Now().Add(wait))
	defer c.SetReadDeadline(time.Time{})
	for n < max {
		m, err := c.Read(buf[n:])
		n += m
		pk.data = buf[:n]
		if done := sniff(&pk); done || err != nil {
			break
		}
	}
	if pk.name != "" {
		pk.name = canonicalName(pk.name)
	}
	return pk
}

// sniff classifies pk.data and finds its name; true when more bytes would
// not change the answer.
func sniff(pk *peeked) bool {
	d := pk.data
	switch {
	case len(d) == 0:
		return false
	case d[0] == 0x16:
		pk.kind = kindTLS
		name, complete := helloName(d)
		pk.name = name
		return complete
	case looksHTTP(d):
		pk.kind = kindHTTP
		if !bytes.Contains(d, []byte("\r\n\r\n")) {
			return false
		}
		req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(d)))
		if err == nil && req.Method != http.MethodConnect {
			pk.name = hostOnly(req.Host)
		}
		return true
	}
	pk.kind = kindRaw
	return true
}

// looksHTTP: an upper-case method token and a space, as far as seen.
func looksHTTP(d []byte) bool {
	for i, c := range d {
		switch {
		case c == ' ':
			return i > 0
		case c < 'A' || c > 'Z' || i >= 10:
			return false
		}
	}
	return len(d) < 10
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return hostport
}

var errHelloSeen = errors.New("client hello seen")

// helloName parses a TLS ClientHello with crypto/tls itself and returns
// its server name; complete is false while the hello is cut short.
func helloName(d []byte) (name string, complete bool) {
	var hello *tls.ClientHelloInfo
	srv := tls.Server(&replayConn{r: bytes.NewReader(d)}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h
			return nil, errHelloSeen
		},
	})
	err := srv.Handshake()
	if hello != nil {
		return hello.ServerName, true
	}
	// Short input ends in EOF; anything else is not going to parse.
	return "", !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF)
}

// replayConn feeds recorded bytes to crypto/tls and swallows its replies.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *replayConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *replayConn) Close() error                     { return nil }
func (c *replayConn) SetDeadline(time.Time) error      { return nil }
func (c *replayConn) SetReadDeadline(time.Time) error  { return nil }
func (c *replayConn) SetWriteDeadline(time.Time) error { return nil }
func (c *replayConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *replayConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// prefixConn replays what peek read before reading on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}
