package dialout

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// A stream frame is one binary message: a type byte, the stream id (big
// endian uint32), then the payload: data bytes, or for a window frame the
// credit it adds (uint32).
const (
	frameOpen   byte = 1 // host → runtime: a new stream
	frameData   byte = 2
	frameWindow byte = 3 // the receiver consumed this much: send more
	frameFin    byte = 4 // the sender closed the stream
	frameReset  byte = 5 // the stream is unknown or was refused

	headerLen = 5
	// StreamWindow is how much a stream may have in flight unread: the
	// receiver's buffer, and the sender's credit when it opens.
	StreamWindow = 256 << 10
	// maxChunk bounds one data frame's payload.
	maxChunk = 32 << 10
	// MaxStreams bounds the streams open on one link.
	MaxStreams = 256
)

// ErrStreamReset is a stream's error once the peer refused or dropped it.
var ErrStreamReset = errors.New("dial-out stream reset by the peer")

// errLinkClosed is a stream's error once its link broke.
var errLinkClosed = errors.New("dial-out link closed")

// Mux is a link's streams. The host opens them (Open); the runtime
// accepts them (NewLink's accept). Each has its own window, so a stream
// whose reader stalls holds up neither the link nor the others.
type Mux struct {
	ctx    context.Context
	write  func(context.Context, []byte) error
	accept func(*Stream) bool

	// rbuf holds the payload being received (receive runs on the
	// logical connection's one reading goroutine).
	rbuf []byte

	mu      sync.Mutex
	streams map[uint32]*Stream
	next    uint32
	closed  bool
}

func newMux(ctx context.Context, write func(context.Context, []byte) error, accept func(*Stream) bool) *Mux {
	return &Mux{ctx: ctx, write: write, accept: accept, streams: map[uint32]*Stream{}, next: 1}
}

// Open opens a stream to the peer.
func (m *Mux) Open() (*Stream, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errLinkClosed
	}
	if len(m.streams) >= MaxStreams {
		m.mu.Unlock()
		return nil, fmt.Errorf("dial-out link has %d streams open, the limit", MaxStreams)
	}
	id := m.next
	m.next += 2
	s := newStream(m, id)
	m.streams[id] = s
	m.mu.Unlock()
	if err := m.send(frameOpen, id, nil); err != nil {
		m.remove(id)
		return nil, err
	}
	return s, nil
}

func (m *Mux) send(typ byte, id uint32, payload []byte) error {
	b := make([]byte, headerLen+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], id)
	copy(b[headerLen:], payload)
	if err := m.write(m.ctx, b); err != nil {
		return fmt.Errorf("dial-out link: %w", err)
	}
	return nil
}

// receive handles one binary message. An error breaks the link: the peer
// does not speak the protocol.
func (m *Mux) receive(r io.Reader) error {
	var hdr [headerLen]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("dial-out stream frame: %w", err)
	}
	id := binary.BigEndian.Uint32(hdr[1:])
	if m.rbuf == nil {
		m.rbuf = make([]byte, maxChunk+1)
	}
	n, err := io.ReadFull(r, m.rbuf)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
	case err != nil:
		return err
	default:
		return fmt.Errorf("dial-out stream frame over %d bytes", maxChunk)
	}
	p := m.rbuf[:n]
	if hdr[0] == frameOpen {
		return m.opened(id)
	}
	m.mu.Lock()
	s := m.streams[id]
	m.mu.Unlock()
	if s == nil {
		if hdr[0] == frameData {
			// Data for a stream closed here: the peer's writer must stop.
			_ = m.send(frameReset, id, nil)
		}
		return nil
	}
	switch hdr[0] {
	case frameData:
		s.received(p)
	case frameWindow:
		if len(p) != 4 {
			return errors.New("dial-out window frame without its 4-byte credit")
		}
		s.credited(int(binary.BigEndian.Uint32(p)))
	case frameFin:
		s.ended(io.EOF)
	case frameReset:
		s.ended(ErrStreamReset)
		m.remove(id)
	default:
		return fmt.Errorf("dial-out stream frame of unknown type %d", hdr[0])
	}
	return nil
}

// opened handles the peer's open: accepted, or reset.
func (m *Mux) opened(id uint32) error {
	m.mu.Lock()
	if m.accept == nil || m.closed || len(m.streams) >= MaxStreams || m.streams[id] != nil {
		m.mu.Unlock()
		return m.send(frameReset, id, nil)
	}
	s := newStream(m, id)
	m.streams[id] = s
	m.mu.Unlock()
	if !m.accept(s) {
		m.remove(id)
		return m.send(frameReset, id, nil)
	}
	return nil
}

func (m *Mux) remove(id uint32) {
	m.mu.Lock()
	delete(m.streams, id)
	m.mu.Unlock()
}

// close ends every stream: the link broke.
func (m *Mux) close() {
	m.mu.Lock()
	m.closed = true
	streams := m.streams
	m.streams = map[uint32]*Stream{}
	m.mu.Unlock()
	for _, s := range streams {
		s.ended(errLinkClosed)
	}
}
