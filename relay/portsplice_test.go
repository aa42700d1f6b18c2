package relay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tcpPair is a connected loopback pair: the dialled end and the accepted.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("tcp4", l.Addr().String())
	require.NoError(t, err)
	s, err := l.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestPortConnDelimits: the Transport gets each header block and nothing
// past it, interim 1xx blocks included, and the bytes are the socket's.
func TestPortConnDelimits(t *testing.T) {
	c, s := tcpPair(t)
	pc := newPortConn(c)
	_, err := pc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	early := "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
	final := "HTTP/1.1 200 OK\nContent-Length: 5\r\n\n"
	_, err = s.Write([]byte(early + final + "hello"))
	require.NoError(t, err)

	var got []string
	buf := make([]byte, 4096)
	for len(strings.Join(got, "")) < len(early+final) {
		n, err := pc.Read(buf)
		require.NoError(t, err)
		got = append(got, string(buf[:n]))
	}
	assert.Equal(t, []string{early, final}, got, "each block alone; a bare line feed ends a line as in net/textproto")
	rest, ok := pc.takeBody()
	require.True(t, ok)
	if len(rest) < 5 { // the body arrived in a later segment
		more := make([]byte, 5-len(rest))
		_, err := io.ReadFull(pc.tcp, more)
		require.NoError(t, err)
		rest = append(rest, more...)
	}
	assert.Equal(t, "hello", string(rest))
	_, ok = pc.takeBody()
	assert.False(t, ok, "once")

	// Bytes handed out after the block: the Transport may hold body bytes.
	_, err = pc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	require.NoError(t, err)
	_, err = s.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"))
	require.NoError(t, err)
	r := bufio.NewReader(pc)
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(b))
	_, ok = pc.takeBody()
	assert.False(t, ok)

	// After a 101 the bytes are another protocol's: handed out as read,
	// however many blank lines they hold.
	_, err = pc.Write([]byte("GET / HTTP/1.1\r\nUpgrade: x\r\n\r\n"))
	require.NoError(t, err)
	switched := "HTTP/1.1 101 Switching Protocols\r\n\r\n"
	_, err = s.Write([]byte(switched))
	require.NoError(t, err)
	n, err := io.ReadFull(pc, buf[:len(switched)])
	require.NoError(t, err)
	assert.Equal(t, switched, string(buf[:n]))
	_, err = pc.Write([]byte("frame"))
	require.NoError(t, err)
	_, err = s.Write([]byte("a\n\nb\r\n\r\nc"))
	require.NoError(t, err)
	got = nil
	for len(strings.Join(got, "")) < 9 {
		n, err := pc.Read(buf)
		require.NoError(t, err)
		got = append(got, string(buf[:n]))
	}
	assert.Equal(t, "a\n\nb\r\n\r\nc", strings.Join(got, ""))
	assert.Len(t, got, 1, "not cut at its blank lines")
}

// spliceEnv is the port proxy (newPortProxy) in front of a test server,
// served over TCP so the splice path is taken; dials counts the
// connections the proxy made.
type spliceEnv struct {
	url   string
	dials atomic.Int32
}

func newSpliceEnv(t *testing.T, backend http.Handler) *spliceEnv {
	t.Helper()
	up := httptest.NewServer(backend)
	t.Cleanup(up.Close)
	e := &spliceEnv{}
	addr := strings.TrimPrefix(up.URL, "http://")
	rp := newPortProxy(func(ctx context.Context) (net.Conn, error) {
		e.dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp4", addr)
	}, func(pr *httputil.ProxyRequest) {
		pr.Out.URL.Scheme, pr.Out.URL.Host = "http", "upstream"
	}, nil)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rp.ServeHTTP(w, r.WithContext(withSplice(r.Context(), w)))
	}))
	t.Cleanup(func() {
		front.Close()
		rp.Transport.(*http.Transport).CloseIdleConnections()
	})
	e.url = front.URL
	return e
}

func TestPortProxySplicesLargeBodies(t *testing.T) {
	big := make([]byte, 3<<20+123)
	_, _ = rand.Read(big)
	e := newSpliceEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			if r.URL.Query().Has("hint") {
				w.Header().Set("Link", "</x>")
				w.WriteHeader(http.StatusEarlyHints)
			}
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(big)
		case "/tail": // the last bytes come after a pause, on a connection kept open
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			w.WriteHeader(http.StatusPartialContent)
			_, _ = w.Write(big[:len(big)-1000])
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
			_, _ = w.Write(big[len(big)-1000:])
		case "/echo":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = w.Write(big)
		case "/short": // promises more than it sends
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			_, _ = w.Write(big[:2<<20])
			panic(http.ErrAbortHandler)
		default:
			_, _ = io.WriteString(w, "small")
		}
	}))
	client := &http.Client{Timeout: 10 * time.Second}
	get := func(method, path string, body io.Reader) (*http.Response, []byte, error) {
		req, err := http.NewRequest(method, e.url+path, body)
		require.NoError(t, err)
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}

	_, b, err := get("GET", "/small", nil)
	require.NoError(t, err)
	assert.Equal(t, "small", string(b))
	_, b, err = get("GET", "/small", nil)
	require.NoError(t, err)
	assert.Equal(t, "small", string(b))
	assert.EqualValues(t, 1, e.dials.Load(), "a small body's connection is kept")

	// /tail: a splice that waited for more bytes than the body has left
	// would wait here until the client's timeout.
	for _, path := range []string{"/big", "/big?hint=1", "/tail"} {
		resp, b, err := get("GET", path, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusPartialContent, resp.StatusCode, "the status is the server's")
		assert.True(t, bytes.Equal(big, b), "%s: %d bytes, byte for byte", path, len(b))
	}
	assert.EqualValues(t, 3, e.dials.Load(), "a spliced body's connection is not reused")

	resp, b, err := get("HEAD", "/big", nil)
	require.NoError(t, err)
	assert.Empty(t, b)
	assert.Equal(t, int64(len(big)), resp.ContentLength)

	// A request with a body is copied, not spliced.
	_, b, err = get("POST", "/echo", strings.NewReader("x"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(big, b))

	// A body cut short is an error for the client, not a short success.
	_, b, err = get("GET", "/short", nil)
	assert.Error(t, err, "got %d bytes", len(b))

	// A client that goes away mid-body ends the splice (goleak checks
	// nothing is left).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/big", nil)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, err = io.ReadFull(resp.Body, make([]byte, 1000))
	require.NoError(t, err)
	resp.Body.Close()
}
