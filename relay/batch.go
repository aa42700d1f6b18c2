package relay

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
)

// batchBytes bounds what a corked connection holds before writing it out.
const batchBytes = 64 << 10

// batchConn is the relay socket's connection. The websocket library
// flushes every frame it writes; while the bridge sends a batch of lines
// the connection is corked, so those flushes fill one buffer that goes out
// in one write when the batch ends (or the buffer is full). Frames stay
// one per line; only the syscalls are shared. The websocket library
// serialises frame writes, and mu orders them with cork and uncork.
type batchConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		if len(c.buf)+len(p) > batchBytes {
			if err := c.flushLocked(); err != nil {
				return 0, err
			}
		}
		if len(p) <= batchBytes {
			c.buf = append(c.buf, p...)
			return len(p), nil
		}
	}
	return c.Conn.Write(p)
}

func (c *batchConn) cork() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = true
}

// uncork writes out what the batch left buffered.
func (c *batchConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	return c.flushLocked()
}

func (c *batchConn) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	return err
}

// hijackWriter hands the websocket library a batchConn when it hijacks
// the upgraded connection.
type hijackWriter struct {
	http.ResponseWriter
	conn *batchConn
}

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the connection cannot be hijacked")
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.conn = &batchConn{Conn: c}
	return w.conn, bufio.NewReadWriter(brw.Reader, bufio.NewWriter(w.conn)), nil
}
