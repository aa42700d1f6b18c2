package rpc

import (
	"context"
	"io"

	"github.com/coder/websocket"
)

// wsConn frames messages as WebSocket text messages.
type wsConn struct {
	ctx context.Context
	c   *websocket.Conn
}

// ReadFrame returns the next text message. A binary message closes the
// connection with 1003; a message over the read limit is closed with 1009
// by the websocket library before it is buffered whole.
func (w *wsConn) ReadFrame() ([]byte, error) {
	typ, r, err := w.c.Reader(w.ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		_ = w.c.Close(websocket.StatusUnsupportedData, "binary frames are not supported: send each JSON-RPC message as one text frame")
		return nil, io.ErrUnexpectedEOF
	}
	return io.ReadAll(r)
}

func (w *wsConn) WriteFrame(b []byte) error {
	return w.c.Write(w.ctx, websocket.MessageText, b)
}

func (w *wsConn) Close() error {
	return w.c.Close(websocket.StatusNormalClosure, "")
}
