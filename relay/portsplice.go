package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"

	"golang.org/x/sys/unix"
)

// A large response body of an exposed port moves by splice(2) from the
// session's server to the client, without passing through boxrt's memory,
// and boxrt wakes for it once per 256 KiB rather than per segment the
// server writes: on two cores shared by the client, the server and boxrt,
// boxrt's CPU is throughput, and this halves it (the bench's 64 MiB GET on
// the loaded two-core test machine: about 730 µs of CPU per MiB copied
// through a buffer, 600 spliced, 310 spliced with the wake-up mark).
//
// httputil.ReverseProxy reads a body through the Transport's buffered
// reader, which would already hold the body's first bytes. So the
// connection the Transport dials (portConn) hands it a response's header
// block and nothing past it; the bytes read beyond stay with portConn.
// When the header announces a large body of known length and the request
// had none, spliceLarge swaps the body for a splicedBody: portConn's
// bytes first, then the rest straight from the socket to the client's
// through the ResponseWriter's ReadFrom. A spliced body's connection is
// not reused (the Transport closes a body it did not read).
//
// A server that garbles the framing (bytes before the request, a header
// block that is not one) can only garble its own response: a body is
// spliced only from its own port's connection and never beyond its
// Content-Length.

// spliceMinBytes: smaller bodies are copied, and their connection kept
// for the next request.
const spliceMinBytes = 1 << 20

// portConn is a connection to a session's server that delimits response
// header blocks (see above). It embeds net.Conn, not *net.TCPConn, so
// nothing reaches the socket around rest (TCPConn's WriteTo would).
type portConn struct {
	net.Conn
	tcp *net.TCPConn

	mu sync.Mutex
	// rest was read past a header block; it is handed out before the
	// socket's next bytes.
	rest []byte
	// armed: a request was written and its final response's header
	// block has not ended yet.
	armed bool
	// fresh: a final header block just ended and no byte after it was
	// handed out, so the Transport holds nothing of that body.
	fresh bool
	// upgraded: a 101 ended the HTTP exchange; the bytes each way are
	// another protocol's, never delimited again.
	upgraded bool
	head     headScan
}

func newPortConn(c *net.TCPConn) *portConn { return &portConn{Conn: c, tcp: c} }

// Write starts a response's header block over: the Transport reads a
// response only after writing its request (and splicing needs a request
// without a body, which is written whole before any answer comes).
func (c *portConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.armed, c.fresh, c.head = !c.upgraded, false, headScan{}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *portConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		n = c.handOut(p, n)
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if k := c.handOut(p, n); k < n {
		// A socket read that returns bytes returns no error; the next
		// read meets the error again.
		return k, nil
	}
	return n, err
}

// handOut decides how much of p[:n], about to be returned, goes out now:
// all of it, or up to the end of the header block being delimited (the
// remainder goes back in front of rest).
func (c *portConn) handOut(p []byte, n int) int {
	if n <= 0 {
		return n
	}
	if !c.armed {
		c.fresh = false
		return n
	}
	k, ended := c.head.feed(p[:n])
	if !ended {
		return n
	}
	switch {
	case c.head.interim():
		c.head = headScan{} // a 1xx: the final header block follows
	case c.head.switched():
		c.armed, c.upgraded = false, true
	default:
		c.armed, c.fresh = false, true
	}
	if k < n {
		c.rest = append(append([]byte(nil), p[k:n]...), c.rest...)
	}
	return k
}

// takeBody hands the body over to a splice: the bytes already read past
// its header block, and false when the Transport may hold some of it.
func (c *portConn) takeBody() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.fresh {
		return nil, false
	}
	c.fresh = false
	rest := c.rest
	c.rest = nil
	return rest, true
}

// headScan finds the end of a header block the way net/textproto does:
// the first empty line ("\n" or "\r\n") after the status line. It keeps
// the status code (bytes 9-11 of "HTTP/1.1 200 OK").
type headScan struct {
	n    int // bytes of the block seen
	code [3]byte
	// lf: 0 inside a line, 1 right after a line feed, 2 after a line
	// feed and a carriage return.
	lf int
}

// feed scans b; it returns how many of its bytes belong to the block and
// whether the block ended there.
func (h *headScan) feed(b []byte) (int, bool) {
	for i, ch := range b {
		if h.n >= 9 && h.n < 12 {
			h.code[h.n-9] = ch
		}
		h.n++
		switch {
		case ch == '\n' && h.lf > 0:
			return i + 1, true
		case ch == '\n':
			h.lf = 1
		case ch == '\r' && h.lf == 1:
			h.lf = 2
		default:
			h.lf = 0
		}
	}
	return len(b), false
}

// interim: the block was a 1xx other than 101, after which the Transport
// reads another header block for the same request.
func (h *headScan) interim() bool { return h.code[0] == '1' && !h.switched() }

// switched: the block was a 101 Switching Protocols.
func (h *headScan) switched() bool { return string(h.code[:]) == "101" }

// spliceState is what a proxied request's response needs to be spliced:
// the client's ResponseWriter and the connection the Transport used.
type spliceState struct {
	w    http.ResponseWriter
	mu   sync.Mutex
	conn *portConn
}

type spliceKey struct{}

// withSplice prepares r's context for spliceLarge.
func withSplice(ctx context.Context, w http.ResponseWriter) context.Context {
	st := &spliceState{w: w}
	ctx = context.WithValue(ctx, spliceKey{}, st)
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		pc, _ := info.Conn.(*portConn)
		st.mu.Lock()
		st.conn = pc
		st.mu.Unlock()
	}})
}

// spliceLarge is the reverse proxy's ModifyResponse: it swaps a large
// body of known length for a splicedBody when its bytes are all still
// with the connection. httputil.ReverseProxy writes the status and
// header before it reads the body, which splicedBody writes itself.
func spliceLarge(res *http.Response) error {
	req := res.Request
	st, _ := req.Context().Value(spliceKey{}).(*spliceState)
	if st == nil || res.ContentLength < spliceMinBytes || req.Method == http.MethodHead || req.Body != nil {
		return nil
	}
	rf, ok := st.w.(io.ReaderFrom)
	st.mu.Lock()
	conn := st.conn
	st.mu.Unlock()
	if !ok || conn == nil {
		return nil
	}
	rest, ok := conn.takeBody()
	if !ok {
		return nil
	}
	res.Body = &splicedBody{orig: res.Body, rest: rest, src: conn.tcp, w: st.w, rf: rf, left: res.ContentLength}
	return nil
}

// splicedBody writes the whole body to the client at its first Read,
// which then reports the end.
type splicedBody struct {
	orig io.ReadCloser // the Transport's body, never read: closing it ends the connection
	rest []byte
	src  *net.TCPConn
	w    http.ResponseWriter
	rf   io.ReaderFrom
	left int64
	done bool
	err  error
}

func (b *splicedBody) Read([]byte) (int, error) {
	if !b.done {
		b.done = true
		b.err = b.copy()
	}
	if b.err != nil {
		return 0, b.err
	}
	return 0, io.EOF
}

func (b *splicedBody) copy() error {
	if head := b.rest[:min(int64(len(b.rest)), b.left)]; len(head) > 0 {
		if _, err := b.w.Write(head); err != nil {
			return err
		}
		b.left -= int64(len(head))
	}
	// While more than twice spliceLowat of the body is left, the socket
	// wakes the splice only once spliceLowat bytes wait (SO_RCVLOWAT),
	// not at every segment the server writes; the last stretch goes at
	// any size, so no wait asks for bytes the server will not send.
	if bulk := b.left - 2*spliceLowat; bulk > 0 && setLowat(b.src, spliceLowat) == nil {
		err := b.splice(bulk)
		if lerr := setLowat(b.src, 1); err == nil {
			err = lerr
		}
		if err != nil {
			return err
		}
	}
	return b.splice(b.left)
}

// spliceLowat is how many bytes wake a spliced body's socket.
const spliceLowat = 256 << 10

func (b *splicedBody) splice(size int64) error {
	n, err := b.rf.ReadFrom(&io.LimitedReader{R: b.src, N: size})
	b.left -= n
	if err == nil && n < size {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func setLowat(c *net.TCPConn, n int) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	cerr := raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, n) })
	return errors.Join(cerr, err)
}

func (b *splicedBody) Close() error { return b.orig.Close() }
