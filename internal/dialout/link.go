package dialout

import (
	"context"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Link is one WebSocket between a runtime and its host: it carries a
// logical connection's frames (Conn) and its own streams (Mux) until it
// breaks. A Link never comes back; the runtime dials a new one.
type Link struct {
	ws     *websocket.Conn
	ctx    context.Context // ends when the link is closed
	cancel context.CancelFunc
	mux    *Mux

	closeOnce sync.Once
	// detached is closed once the logical connection stopped reading the
	// link, so its received count is final.
	detached   chan struct{}
	detachOnce sync.Once
}

// NewLink wraps ws, whose handshake is done. accept receives the streams
// the peer opens (nil: opens are refused). keepalive pings the peer every
// interval; one that does not answer within timeout breaks the link.
func NewLink(ws *websocket.Conn, accept func(*Stream) bool, interval, timeout time.Duration) *Link {
	ctx, cancel := context.WithCancel(context.Background())
	l := &Link{ws: ws, ctx: ctx, cancel: cancel, detached: make(chan struct{})}
	l.mux = newMux(ctx, func(ctx context.Context, b []byte) error {
		return ws.Write(ctx, websocket.MessageBinary, b)
	}, accept)
	ws.SetReadLimit(maxMessage)
	if interval > 0 {
		go l.keepalive(interval, timeout)
	}
	return l
}

// maxMessage is the largest message either side sends: a JSON-RPC frame
// (16 MiB, docs/protocol.md) with room for nothing else.
const maxMessage = 16 << 20

// Mux is the link's streams.
func (l *Link) Mux() *Mux { return l.mux }

// Done is closed when the link is closed.
func (l *Link) Done() <-chan struct{} { return l.ctx.Done() }

// Close breaks the link: its streams end, and the logical connection it
// carried waits for the next one.
func (l *Link) Close() {
	l.closeOnce.Do(func() {
		l.cancel()
		l.mux.close()
		_ = l.ws.CloseNow()
	})
}

// CloseWith closes the link with a WebSocket close status the peer sees.
func (l *Link) CloseWith(code websocket.StatusCode, reason string) {
	_ = l.ws.Close(code, reason)
	l.Close()
}

func (l *Link) detach() { l.detachOnce.Do(func() { close(l.detached) }) }

func (l *Link) keepalive(interval, timeout time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(l.ctx, timeout)
		err := l.ws.Ping(ctx)
		cancel()
		if err != nil {
			l.Close()
			return
		}
	}
}
