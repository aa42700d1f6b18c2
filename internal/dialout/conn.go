package dialout

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// ErrEnded is returned once a logical connection has ended.
var ErrEnded = errors.New("dial-out connection ended")

// ErrGoingAway is why a logical connection ends when the peer closed its
// link with 1001 (going away: shutting down).
var ErrGoingAway = errors.New("dial-out peer went away (shutting down)")

// ErrExpired is why a logical connection ends when no link resumed it
// within its window.
var ErrExpired = errors.New("dial-out connection not resumed in time")

// Options configure a logical connection.
type Options struct {
	Limits Limits
	// Window is how long the connection waits for a new link after one
	// broke before it ends.
	Window time.Duration
	// Classify says how a frame is kept for replay (nil: all Keep).
	Classify func(frame []byte) Class
	// OnLost is told, during a resumption, what could not be replayed.
	// It returns a frame to send the peer after the replay (nil: none) and
	// frames ReadFrame returns before anything more from the peer (nil:
	// none), e.g. error answers for calls whose requests were lost.
	OnLost func(connID string, lost Lost) (send []byte, local [][]byte)
}

// Conn is a logical connection: whole text frames in both directions,
// carried by one Link at a time and resumed on the next one. ReadFrame
// returns frames from whatever link is current, waiting between links;
// WriteFrame never waits for a link: the frame goes into the replay
// buffer and out on the current link, if any. It ends (ErrEnded, or
// ErrExpired) when End is called or no link resumed it within the window.
type Conn struct {
	id   string
	opts Options

	wmu  sync.Mutex // serialises writes and replays
	seq  uint64     // frames sent
	sent replay

	mu     sync.Mutex
	local  [][]byte // OnLost's frames for ReadFrame
	cur    *Link
	wake   chan struct{} // closed and replaced when cur is set or the conn ends
	ended  bool
	endErr error
	expiry *time.Timer

	received atomic.Uint64 // frames delivered by ReadFrame
	rbuf     bytes.Buffer  // reused between reads: the ReadFrame contract
}

// NewConn starts a logical connection, detached: it waits up to its window
// for a first link.
func NewConn(id string, opts Options) *Conn {
	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits
	}
	c := &Conn{id: id, opts: opts, sent: replay{lim: opts.Limits}, wake: make(chan struct{})}
	c.mu.Lock()
	c.armExpiry()
	c.mu.Unlock()
	return c
}

// ID is the connection's id, which a Hello names to resume it.
func (c *Conn) ID() string { return c.id }

// Received counts the frames ReadFrame delivered.
func (c *Conn) Received() uint64 { return c.received.Load() }

// Ended reports whether the connection has ended.
func (c *Conn) Ended() bool { return c.err() != nil }

// err is why the connection ended, nil while it lives.
func (c *Conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endErr
}

// Attached reports whether a link carries the connection now.
func (c *Conn) Attached() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur != nil
}

// Link is the current link, nil between links.
func (c *Conn) Link() *Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// ReadFrame returns the next text frame, valid until the next call; binary
// frames go to the link's streams on the way.
func (c *Conn) ReadFrame() ([]byte, error) {
	for {
		l, local, err := c.next()
		if err != nil || local != nil {
			return local, err
		}
		typ, r, err := l.ws.Reader(l.ctx)
		if err == nil {
			if typ == websocket.MessageBinary {
				err = l.mux.receive(r)
			} else {
				c.rbuf.Reset()
				if _, err = c.rbuf.ReadFrom(r); err == nil {
					c.received.Add(1)
					return c.rbuf.Bytes(), nil
				}
			}
		}
		if err != nil {
			c.detach(l)
			if websocket.CloseStatus(err) == websocket.StatusGoingAway {
				// The peer is shutting down: nothing will resume this
				// connection, so what waits on it fails now, not after
				// the window.
				c.End(ErrGoingAway)
			}
		}
	}
}

// next returns a local frame if one waits, else the current link,
// waiting for one.
func (c *Conn) next() (*Link, []byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case len(c.local) > 0:
			f := c.local[0]
			c.local[0] = nil
			c.local = c.local[1:]
			return nil, f, nil
		case c.cur != nil:
			return c.cur, nil, nil
		case c.ended:
			return nil, nil, c.endErr
		}
		wake := c.wake
		c.mu.Unlock()
		<-wake
		c.mu.Lock()
	}
}

// detach drops l after it broke; the window starts.
func (c *Conn) detach(l *Link) {
	l.Close()
	c.mu.Lock()
	if c.cur == l {
		c.cur = nil
		c.armExpiry()
	}
	c.mu.Unlock()
	l.detach()
}

// armExpiry starts the window; c.mu is held.
func (c *Conn) armExpiry() {
	if c.expiry != nil {
		c.expiry.Stop()
	}
	if c.opts.Window <= 0 || c.ended {
		return
	}
	c.expiry = time.AfterFunc(c.opts.Window, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.cur == nil {
			c.endLocked(ErrExpired)
		}
	})
}

// WriteFrame sends frame, or keeps it for the next link.
func (c *Conn) WriteFrame(frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	l, ended, err := c.cur, c.ended, c.endErr
	c.mu.Unlock()
	if ended {
		return err
	}
	c.keep(frame)
	if l != nil {
		if err := l.ws.Write(l.ctx, websocket.MessageText, frame); err != nil {
			// The reader sees the break and detaches the link; the frame
			// goes out again on the next one.
			l.Close()
		}
	}
	return nil
}

// Resume makes l the connection's link: a link still current is broken
// first and its reader waited for, so the received count is final; then
// handshake tells the peer that count and returns the peer's, and what
// the peer lacks is replayed on l, followed by OnLost's notice if frames
// were lost.
func (c *Conn) Resume(l *Link, handshake func(received uint64) (peerReceived uint64, err error)) error {
	if old := c.Link(); old != nil {
		c.detachWait(old)
	}
	if err := c.err(); err != nil {
		return err
	}
	peer, err := handshake(c.received.Load())
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	frames, lost, err := c.sent.since(peer, c.seq)
	if err != nil {
		return err
	}
	var local [][]byte
	if (len(lost.IDs) > 0 || lost.Bulk > 0) && c.opts.OnLost != nil {
		var send []byte
		send, local = c.opts.OnLost(c.id, lost)
		if send != nil {
			// Kept like any frame, so a link that breaks now still
			// carries it on the next.
			frames = append(frames, c.keep(send))
		}
	}
	for _, f := range frames {
		if err = l.ws.Write(l.ctx, websocket.MessageText, f); err != nil {
			err = fmt.Errorf("replaying: %w", err)
			break
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.local = append(c.local, local...)
	switch {
	case c.ended:
		err = c.endErr
	case err == nil:
		c.cur = l
		if c.expiry != nil {
			c.expiry.Stop()
		}
	}
	if c.cur == l || len(local) > 0 {
		close(c.wake)
		c.wake = make(chan struct{})
	}
	return err
}

// keep numbers frame and puts it in the replay buffer; c.wmu is held. It
// returns the buffer's copy.
func (c *Conn) keep(frame []byte) []byte {
	class := Keep
	if c.opts.Classify != nil {
		class = c.opts.Classify(frame)
	}
	c.seq++
	return c.sent.add(c.seq, frame, class)
}

// detachWait breaks l and waits until the reader let go of it. A reader
// that is not reading (nobody calls ReadFrame) is not waited for long.
func (c *Conn) detachWait(l *Link) {
	l.Close()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-l.detached:
	case <-t.C:
		c.detach(l)
	}
}

// End ends the connection with err (ErrEnded if nil): reads and writes
// fail with it, and the current link is closed (with 1001, going away,
// when err is nil: the connection was ended here).
func (c *Conn) End(err error) {
	local := err == nil
	if local {
		err = ErrEnded
	}
	c.mu.Lock()
	l := c.cur
	c.endLocked(err)
	c.mu.Unlock()
	switch {
	case l == nil:
	case local:
		// Ended here (this side is shutting down, or its frame loop is
		// done): the peer hears that nothing will resume the connection,
		// so its calls in flight fail now rather than after the window;
		// a link merely dropped would say nothing.
		l.CloseWith(websocket.StatusGoingAway, "connection ended")
	default:
		l.Close()
	}
}

func (c *Conn) endLocked(err error) {
	if c.ended {
		return
	}
	c.ended, c.endErr = true, err
	if c.expiry != nil {
		c.expiry.Stop()
	}
	close(c.wake)
}

// Close is End(nil), for the frame loop that serves the connection.
func (c *Conn) Close() error {
	c.End(nil)
	return nil
}
