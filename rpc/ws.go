package rpc

import (
	"bytes"
	"context"
	"io"

	"github.com/coder/websocket"
)

// wsConn frames messages as WebSocket text messages.
type wsConn struct {
	ctx context.Context
	c   *websocket.Conn
	buf bytes.Buffer // reused between reads
}

// ReadFrame returns the next text message, valid until the next call. A
// binary message closes the connection with 1003; a message over the read
// limit is closed with 1009 by the websocket library before it is buffered
// whole.
func (w *wsConn) ReadFrame() ([]byte, error) {
	typ, r, err := w.c.Reader(w.ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		_ = w.c.Close(websocket.StatusUnsupportedData, "binary frames are not supported: send each JSON-RPC message as one text frame")
		return nil, io.ErrUnexpectedEOF
	}
	w.buf.Reset()
	if _, err := w.buf.ReadFrom(r); err != nil {
		return nil, err
	}
	if w.buf.Cap() > 1<<20 {
		// Keep a huge message's buffer no longer than it is needed.
		b := bytes.Clone(w.buf.Bytes())
		w.buf = bytes.Buffer{}
		return b, nil
	}
	return w.buf.Bytes(), nil
}

// More is false: the library exposes no read-ahead, so every answer is
// flushed at once.
func (w *wsConn) More() bool { return false }

// WriteFrame sends one message; each is flushed by the library.
func (w *wsConn) WriteFrame(b []byte) error {
	return w.c.Write(w.ctx, websocket.MessageText, b)
}

func (w *wsConn) Flush() error { return nil }

func (w *wsConn) Close() error {
	return w.c.Close(websocket.StatusNormalClosure, "")
}
