package dialout

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// Stream is one stream of a link, a net.Conn. Close sends the end of the
// stream after what was written; the peer reads it as EOF.
type Stream struct {
	m  *Mux
	id uint32

	mu       sync.Mutex
	cond     *sync.Cond
	in       bytes.Buffer
	consumed int   // read since the last window frame
	credit   int   // what may still be sent
	rerr     error // why reading ends once in is drained
	werr     error // why writing fails
	local    bool  // Close was called
	rdl, wdl time.Time
	timers   [2]*time.Timer
}

func newStream(m *Mux, id uint32) *Stream {
	s := &Stream{m: m, id: id, credit: StreamWindow}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *Stream) received(p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rerr != nil || s.local {
		return
	}
	if s.in.Len()+len(p) > StreamWindow {
		// Past the window the peer granted: it does not follow the rules.
		s.rerr, s.werr = ErrStreamReset, ErrStreamReset
		s.cond.Broadcast()
		go func() { _ = s.m.send(frameReset, s.id, nil); s.m.remove(s.id) }()
		return
	}
	s.in.Write(p)
	s.cond.Broadcast()
}

func (s *Stream) credited(n int) {
	s.mu.Lock()
	if s.credit+n <= StreamWindow {
		s.credit += n
	}
	s.cond.Broadcast()
	s.mu.Unlock()
}

// ended: the peer finished writing (io.EOF), reset the stream, or the link
// broke.
func (s *Stream) ended(err error) {
	s.mu.Lock()
	if s.rerr == nil {
		s.rerr = err
	}
	if err != nil && !errors.Is(err, io.EOF) && s.werr == nil {
		s.werr = err
	}
	s.cond.Broadcast()
	s.mu.Unlock()
}

// Read reads what the peer sent, crediting it back every half window.
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	for s.in.Len() == 0 {
		switch {
		case s.local:
			s.mu.Unlock()
			return 0, net.ErrClosed
		case s.rerr != nil:
			err := s.rerr
			s.mu.Unlock()
			return 0, err
		case expired(s.rdl):
			s.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		s.cond.Wait()
	}
	n, _ := s.in.Read(p)
	s.consumed += n
	var grant int
	if s.consumed >= StreamWindow/2 {
		grant, s.consumed = s.consumed, 0
	}
	s.mu.Unlock()
	if grant > 0 {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], uint32(grant))
		if err := s.m.send(frameWindow, s.id, b[:]); err != nil {
			return n, err
		}
	}
	return n, nil
}

// Write sends p in chunks as the peer's window allows.
func (s *Stream) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		s.mu.Lock()
		for s.credit == 0 && s.werr == nil && !s.local && !expired(s.wdl) {
			s.cond.Wait()
		}
		switch {
		case s.local:
			s.mu.Unlock()
			return written, net.ErrClosed
		case s.werr != nil:
			err := s.werr
			s.mu.Unlock()
			return written, err
		case expired(s.wdl):
			s.mu.Unlock()
			return written, os.ErrDeadlineExceeded
		}
		n := min(len(p)-written, s.credit, maxChunk)
		s.credit -= n
		s.mu.Unlock()
		if err := s.m.send(frameData, s.id, p[written:written+n]); err != nil {
			return written, err
		}
		written += n
	}
	return written, nil
}

// Close ends the stream: the peer reads EOF after what was written, and
// its writes fail if it was still writing.
func (s *Stream) Close() error {
	s.mu.Lock()
	if s.local {
		s.mu.Unlock()
		return nil
	}
	s.local = true
	live, peerWriting := s.werr == nil, s.rerr == nil
	for _, t := range s.timers {
		if t != nil {
			t.Stop()
		}
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.m.remove(s.id)
	if !live {
		return nil
	}
	err := s.m.send(frameFin, s.id, nil)
	if err == nil && peerWriting {
		// Nobody reads here any more: the peer's writer must not wait
		// for credit that never comes. The fin went first, so the peer
		// still reads EOF after what was written.
		err = s.m.send(frameReset, s.id, nil)
	}
	return err
}

func (s *Stream) SetDeadline(t time.Time) error {
	_ = s.SetReadDeadline(t)
	return s.SetWriteDeadline(t)
}

func (s *Stream) SetReadDeadline(t time.Time) error { return s.deadline(0, &s.rdl, t) }

func (s *Stream) SetWriteDeadline(t time.Time) error { return s.deadline(1, &s.wdl, t) }

// deadline sets *d to t and wakes the waiters when it passes.
func (s *Stream) deadline(i int, d *time.Time, t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*d = t
	if s.timers[i] != nil {
		s.timers[i].Stop()
		s.timers[i] = nil
	}
	if !t.IsZero() {
		s.timers[i] = time.AfterFunc(time.Until(t), func() {
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		})
	}
	s.cond.Broadcast()
	return nil
}

func expired(t time.Time) bool { return !t.IsZero() && !time.Now().Before(t) }

func (s *Stream) LocalAddr() net.Addr  { return streamAddr(s.id) }
func (s *Stream) RemoteAddr() net.Addr { return streamAddr(s.id) }

// streamAddr names a stream in logs.
type streamAddr uint32

func (streamAddr) Network() string  { return "dialout" }
func (a streamAddr) String() string { return "dialout-stream-" + strconv.FormatUint(uint64(a), 10) }

// Listener hands the runtime's HTTP server the streams its links accept.
type Listener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

// NewListener returns a Listener; Accept is its links' accept function.
func NewListener() *Listener {
	return &Listener{ch: make(chan net.Conn, 64), done: make(chan struct{})}
}

// Offer queues s for Accept; false when the listener is closed or the
// backlog full (the stream is refused).
func (l *Listener) Offer(s *Stream) bool {
	select {
	case <-l.done:
		return false
	default:
	}
	select {
	case l.ch <- s:
		return true
	default:
		return false
	}
}

func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *Listener) Addr() net.Addr { return streamAddr(0) }
