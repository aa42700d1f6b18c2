package reconnect

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// frameConn moves whole JSON-RPC messages: lines on stdio, text messages on
// a WebSocket.
type frameConn interface {
	// ReadFrame returns the next message, valid until the next call.
	ReadFrame() ([]byte, error)
	// WriteFrame writes one message, giving up when ctx ends. It returns
	// how many bytes went out so a caller can tell an untouched stream
	// (still usable) from a torn frame (not).
	WriteFrame(ctx context.Context, b []byte) (int, error)
	Close() error
}

var errTooLarge = fmt.Errorf("incoming message exceeds %d bytes", MaxMessageBytes)

// lineConn is the newline codec: one JSON object per line. json.Marshal
// never emits a raw newline, so a message is always exactly one line.
type lineConn struct {
	r  *bufio.Reader
	rc io.Closer
	w  io.Writer
	wc io.Closer
	// dl interrupts a blocked Write; pipes from os.Pipe and net.Conn have it.
	dl interface{ SetWriteDeadline(time.Time) error }
	// long is reused for lines longer than the read buffer.
	long []byte
}

// readBufferBytes holds a whole exec output notification (a 64 KiB chunk,
// escaped, in its envelope), so streamed output is read without copying
// each line out of the buffer.
const readBufferBytes = 256 << 10

func newLineConn(r io.ReadCloser, w io.WriteCloser) *lineConn {
	lc := &lineConn{r: bufio.NewReaderSize(r, readBufferBytes), rc: r, w: w, wc: w}
	if d, ok := w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		lc.dl = d
	}
	return lc
}

// ReadFrame returns the next non-blank line without its terminator, valid
// until the next ReadFrame: a line that fits the read buffer is not copied
// (streamed output is most of the lines). A line over the limit is fatal:
// the server never sends one (it replaces an oversized response by an
// error), so the stream cannot be trusted.
func (c *lineConn) ReadFrame() ([]byte, error) {
	for {
		var line []byte
		long := false
		for {
			chunk, err := c.r.ReadSlice('\n')
			if err == nil && !long {
				line = chunk // whole in the buffer
				break
			}
			if len(line)+len(chunk) > MaxMessageBytes+1 {
				return nil, errTooLarge
			}
			if !long {
				line, long = c.long[:0], true
			}
			line = append(line, chunk...)
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if errors.Is(err, io.EOF) && len(line) > 0 {
				break // a last line without newline still counts
			}
			return nil, err
		}
		if long && cap(line) <= 1<<20 {
			c.long = line[:0] // a modest buffer is kept for the next long line
		}
		if frame := trimLine(line); len(frame) > 0 {
			return frame, nil
		}
	}
}

func trimLine(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// aLongTimeAgo is a deadline in the past, used to interrupt a write.
var aLongTimeAgo = time.Unix(1, 0)

func (c *lineConn) WriteFrame(ctx context.Context, b []byte) (int, error) {
	msg := make([]byte, 0, len(b)+1)
	msg = append(append(msg, b...), '\n')
	if c.dl == nil {
		return c.w.Write(msg)
	}
	// Clear a deadline an earlier, abandoned write left in the past.
	_ = c.dl.SetWriteDeadline(time.Time{})
	if ctx.Done() == nil {
		return c.w.Write(msg)
	}
	// A blocked pipe write (the child stopped reading) must not outlive
	// the caller's context: move the deadline into the past when ctx ends.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = c.dl.SetWriteDeadline(aLongTimeAgo)
	})
	n, err := c.w.Write(msg)
	if !stop() {
		<-fired // it ran: wait so it cannot poison the next write's deadline
		if err != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
		}
	}
	return n, err
}

func (c *lineConn) Close() error {
	errW := c.wc.Close()
	errR := c.rc.Close()
	if errW != nil {
		return errW
	}
	return errR
}

// wsConn frames messages as WebSocket text messages (one JSON-RPC message
// per frame, as docs/protocol.md says); it is this package's adapter over coder/websocket.
type wsConn struct{ c *websocket.Conn }

func (w *wsConn) ReadFrame() ([]byte, error) {
	for {
		typ, b, err := w.c.Read(context.Background())
		if err != nil {
			return nil, err
		}
		if typ != websocket.MessageText {
			return nil, errors.New("boxrt sent a binary WebSocket message; JSON-RPC uses text frames")
		}
		if len(trimLine(b)) > 0 {
			return b, nil
		}
	}
}

func (w *wsConn) WriteFrame(ctx context.Context, b []byte) (int, error) {
	// coder/websocket closes the connection itself when ctx ends mid-write,
	// so a torn frame can never be followed by another message.
	if err := w.c.Write(ctx, websocket.MessageText, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Close drops the socket without the close handshake: a link is closed
// because it is dead or because the host is leaving, and waiting up to 10 s
// for a stalled peer's close frame helps neither.
func (w *wsConn) Close() error { return w.c.CloseNow() }

// objectStream adapts a frameConn to jsonrpc2.ObjectStream for one link.
type objectStream struct {
	fc frameConn
	// writeCtx returns the context of the call being written; it is read
	// by the writing goroutine while it holds link.wsem.
	writeCtx func() context.Context
	// onWriteError is told about writes that broke the stream.
	onWriteError func(error)
	// onReadEnd is told, once, why reading stopped.
	onReadEnd func(error)
	// onOutput gets the exec output notifications parseOutputFrame reads,
	// in order with the messages jsonrpc2 handles (both on the reading
	// goroutine).
	onOutput func(outputNotice)
	logger   interface{ Debug(string, ...any) }

	endOnce sync.Once
}

// errWriteAborted: the caller's context ended before any byte of the
// message was written; the stream is intact and the link stays up.
type errWriteAborted struct{ err error }

func (e *errWriteAborted) Error() string { return "write abandoned: " + e.err.Error() }
func (e *errWriteAborted) Unwrap() error { return e.err }

func (s *objectStream) WriteObject(obj any) error {
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if len(b) > MaxMessageBytes {
		return fmt.Errorf("request of %d bytes exceeds the %d-byte message limit", len(b), MaxMessageBytes)
	}
	ctx := s.writeCtx()
	n, err := s.fc.WriteFrame(ctx, b)
	if err == nil {
		return nil
	}
	if n == 0 && ctx.Err() != nil {
		return &errWriteAborted{context.Cause(ctx)}
	}
	s.onWriteError(err)
	return err
}

func (s *objectStream) ReadObject(v any) error {
	for {
		frame, err := s.fc.ReadFrame()
		if err != nil {
			s.endOnce.Do(func() { s.onReadEnd(err) })
			return err
		}
		if n, ok := parseOutputFrame(frame); ok && s.onOutput != nil {
			s.onOutput(n)
			continue
		}
		// Lines that are not JSON at all (a wrapper script's banner, a
		// stray print) are skipped rather than fatal; well-formed JSON that
		// is not JSON-RPC still ends the link through jsonrpc2. Unmarshal
		// checks the syntax before it stores anything, so a syntax error
		// leaves v untouched and the line costs no separate pass (a
		// box_exec result carries up to 2 MiB of output).
		err = json.Unmarshal(frame, v)
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			s.logger.Debug("skipping a non-JSON line from boxrt", "bytes", len(frame))
			continue
		}
		if err != nil {
			s.endOnce.Do(func() { s.onReadEnd(err) })
			return err
		}
		return nil
	}
}

func (s *objectStream) Close() error { return s.fc.Close() }
