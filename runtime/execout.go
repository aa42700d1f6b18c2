package runtime

import (
	"errors"
	"io"
	"slices"
	"sync"
	"time"
	"unicode/utf8"
)

// Output streams of an exec.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// Coalescing of streamed output: a chunk goes out when ExecChunkBytes are
// waiting or ExecChunkDelay after the first waiting byte, whichever comes
// first, so a chatty command costs a message per 64 KiB, not per write,
// and a quiet one is still seen within 20 ms. Each message costs the
// sender a wake-up and a write and the host a read and a dispatch: at
// 16 KiB those, not the bytes, were most of a fast stream's cost.
const (
	ExecChunkBytes = 64 << 10
	ExecChunkDelay = 20 * time.Millisecond
)

// ExecReplayBytes bounds the output an exec keeps for hosts that attach
// later (box_exec_attach replays from it).
const ExecReplayBytes = 1 << 20

// ExecChunk is one piece of an exec's output, in the order the exec's
// streams produced it (Seq counts chunks of both streams from 0).
type ExecChunk struct {
	ExecID string
	Seq    int64
	Stream string
	// Offset is how many bytes of Stream came before this chunk.
	Offset int64
	Data   []byte
	// EOF marks the last chunk a subscriber gets, without data: the
	// exec ended and everything before was delivered.
	EOF bool
	// More says that the subscriber gets the next chunk right away, so a
	// sink may hold this one back to send them together.
	More bool
}

// ChunkSink receives an exec's chunks in order. It may block (the command
// then waits, as on a full pipe); an error ends the subscription. The
// chunk's Data is valid until the sink returns: its buffer is reused once
// every subscriber is past it, so a sink that keeps the bytes copies them.
type ChunkSink func(ExecChunk) error

// execOutput is an exec's chunk log: a bounded replay buffer plus the
// subscribers following it. The producer never overwrites a chunk a live
// subscriber has not taken yet: it waits instead (backpressure, as a pipe
// gives), unless the exec is being killed (abort), when the chunk log goes
// lossy so that the kill cannot hang on a host that stopped reading.
// Chunks dropped from the front are counted for attach.
type execOutput struct {
	id    string
	max   int
	abort <-chan struct{}

	mu           sync.Mutex
	chunks       []ExecChunk
	first, next  int64 // seq of chunks[0]; seq of the next chunk
	bytes        int   // of chunks
	droppedBytes int64
	offsets      [2]int64
	closed       bool
	changed      chan struct{} // closed and replaced whenever anything changes
	subs         map[*subscriber]struct{}
}

type subscriber struct{ next int64 }

func newExecOutput(id string, max int, abort <-chan struct{}) *execOutput {
	return &execOutput{id: id, max: max, abort: abort, changed: make(chan struct{}), subs: map[*subscriber]struct{}{}}
}

func (o *execOutput) broadcastLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// lagLocked reports whether a subscriber still needs the oldest chunk.
func (o *execOutput) lagLocked() bool {
	for s := range o.subs {
		if s.next <= o.first {
			return true
		}
	}
	return false
}

func (o *execOutput) append(stream string, data []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.chunks) > 0 && o.bytes+len(data) > o.max && o.lagLocked() {
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-o.abort:
		}
		o.mu.Lock()
		if isClosed(o.abort) {
			break
		}
	}
	i := 0
	if stream == StreamStderr {
		i = 1
	}
	o.chunks = append(o.chunks, ExecChunk{ExecID: o.id, Seq: o.next, Stream: stream, Offset: o.offsets[i], Data: data})
	o.offsets[i] += int64(len(data))
	o.next++
	o.bytes += len(data)
	for len(o.chunks) > 1 && o.bytes > o.max && (!o.lagLocked() || isClosed(o.abort)) {
		o.dropOldestLocked()
	}
	o.broadcastLocked()
}

// dropOldestLocked drops the oldest chunk, and recycles its buffer when no
// subscriber can still be reading it.
func (o *execOutput) dropOldestLocked() {
	c := o.chunks[0]
	if !o.lagLocked() {
		putChunkBuf(c.Data)
	}
	o.chunks[0] = ExecChunk{}
	o.chunks = o.chunks[1:]
	o.first++
	o.bytes -= len(c.Data)
	o.droppedBytes += int64(len(c.Data))
}

// trim drops the oldest chunks no subscriber still needs until at most
// max bytes are kept (an ended exec's log, kept for late attaches), and
// returns the bytes kept.
func (o *execOutput) trim(max int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.chunks) > 0 && o.bytes > max && !o.lagLocked() {
		o.dropOldestLocked()
	}
	// A copy: the slice's array still holds the dropped chunks' slots.
	o.chunks = slices.Clone(o.chunks)
	return o.bytes
}

func (o *execOutput) close() {
	o.mu.Lock()
	o.closed = true
	o.broadcastLocked()
	o.mu.Unlock()
}

// Replay says what a subscription starting at FromSeq will miss.
type Replay struct {
	FromSeq       int64 `json:"from_seq"`
	FirstSeq      int64 `json:"first_seq"`
	DroppedChunks int64 `json:"dropped_chunks"`
	// DroppedBytes is exact from seq 0; for a later FromSeq that was itself
	// dropped it counts from the oldest dropped byte, an upper bound.
	DroppedBytes int64 `json:"dropped_bytes"`
}

// subscribe registers a subscriber from fromSeq (clamped to what is
// kept) and returns it with the replay report.
func (o *execOutput) subscribe(fromSeq int64) (*subscriber, Replay) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rep := Replay{FromSeq: fromSeq, FirstSeq: o.first}
	if fromSeq < o.first {
		rep.DroppedChunks = o.first - fromSeq
		rep.DroppedBytes = o.droppedBytes
	}
	s := &subscriber{next: max(fromSeq, o.first)}
	o.subs[s] = struct{}{}
	return s, rep
}

func (o *execOutput) unsubscribe(s *subscriber) {
	o.mu.Lock()
	delete(o.subs, s)
	o.broadcastLocked()
	o.mu.Unlock()
}

// follow hands s its chunks in order until the output is closed and
// drained, sink fails or stop is closed; it unsubscribes s on return.
func (o *execOutput) follow(s *subscriber, sink ChunkSink, stop <-chan struct{}) {
	defer o.unsubscribe(s)
	for {
		o.mu.Lock()
		var batch []ExecChunk
		if s.next < o.first { // dropped while the exec was being killed
			s.next = o.first
		}
		if s.next < o.next {
			batch = append(batch, o.chunks[s.next-o.first:]...)
		}
		closed, ch := o.closed, o.changed
		o.mu.Unlock()
		for i, c := range batch {
			c.More = i < len(batch)-1
			if sink(c) != nil {
				return
			}
			o.mu.Lock()
			s.next = c.Seq + 1
			o.broadcastLocked()
			o.mu.Unlock()
		}
		if len(batch) > 0 {
			continue
		}
		if closed {
			_ = sink(ExecChunk{ExecID: o.id, Seq: s.next, EOF: true})
			return
		}
		select {
		case <-ch:
		case <-stop:
			return
		}
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// chunker coalesces one stream's writes into chunks of the output (see
// ExecChunkBytes). Chunks end on a UTF-8 character boundary where the
// data allows, so text never arrives split inside a character. The bytes
// are gathered in the buffer that becomes the chunk, so a chunk costs one
// copy of its bytes; the buffer grows with what is written (a command
// printing a line costs a small one), and starts at full size once a full
// chunk was cut (a command streaming a lot).
type chunker struct {
	out    *execOutput
	stream string

	mu     sync.Mutex
	buf    []byte
	full   bool // the last chunk cut was a full one
	timer  *time.Timer
	closed bool
}

func (c *chunker) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return len(p), nil
	}
	n := len(p)
	for len(p) > 0 {
		if c.full && cap(c.buf) < ExecChunkBytes {
			c.buf = append(getChunkBuf(), c.buf...)
		}
		take := min(len(p), ExecChunkBytes-len(c.buf))
		c.buf = appendBounded(c.buf, p[:take], ExecChunkBytes)
		p = p[take:]
		if len(c.buf) == ExecChunkBytes {
			c.emitLocked(false)
		}
	}
	if len(c.buf) > 0 && c.timer == nil {
		c.timer = time.AfterFunc(ExecChunkDelay, c.tick)
	}
	return n, nil
}

func (c *chunker) tick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timer = nil
	if !c.closed && len(c.buf) > 0 {
		c.emitLocked(false)
	}
}

// emitLocked sends buf as a chunk, all of it when final, else without an
// unfinished character at its end, which stays for the next chunk.
func (c *chunker) emitLocked(final bool) {
	n := len(c.buf)
	if !final {
		if i := lastRuneStart(c.buf); i > 0 && !utf8.FullRune(c.buf[i:]) && n-i < utf8.UTFMax {
			n = i
		}
	}
	if n == 0 {
		return
	}
	var data []byte
	if n < cap(c.buf)/2 {
		// A short chunk (cut by the timer) out of a large buffer: the
		// chunk log holds it for replay, so it gets an array of its size
		// and the buffer is kept.
		data = append([]byte(nil), c.buf[:n]...)
		c.buf = append(c.buf[:0], c.buf[n:]...)
	} else {
		data = c.buf[:n] // its capacity is how putChunkBuf knows it
		c.buf = append([]byte(nil), c.buf[n:]...)
	}
	c.full = n >= ExecChunkBytes-utf8.UTFMax
	c.out.append(c.stream, data)
}

// chunkBufs recycles the full-size buffers a fast stream's chunks are
// gathered in: without it every 64 KiB of output was a fresh allocation,
// and a stream of a few hundred MB/s kept the GC running.
var chunkBufs sync.Pool // of *[]byte

func getChunkBuf() []byte {
	if p, ok := chunkBufs.Get().(*[]byte); ok {
		return (*p)[:0]
	}
	return make([]byte, 0, ExecChunkBytes)
}

// putChunkBuf takes back a chunk's buffer that nothing reads any more
// (only the full-size ones getChunkBuf lent).
func putChunkBuf(b []byte) {
	if cap(b) == ExecChunkBytes {
		b = b[:0]
		chunkBufs.Put(&b)
	}
}

// close sends what is left.
func (c *chunker) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if len(c.buf) > 0 {
		c.emitLocked(true)
	}
	c.buf = nil
	c.closed = true
}

// lockedHeadTail is a headTail the command writes while a waiter may
// read it (box_exec_wait answering before the end).
type lockedHeadTail struct {
	mu sync.Mutex
	h  *headTail
}

func (l *lockedHeadTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.Write(p)
}

// copyBufs lends the buffers a command's long output is read through once
// its head is full. io.Copy would allocate 32 KiB for each stream of every
// exec: a burst of a thousand execs made 64 MB of garbage, and the heap a
// burst leaves behind grows with it.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ReadFrom reads r to its end; io.Copy calls it. While the head has room
// (all of most commands' output) the bytes are read straight into it, so
// an exec holds no buffer beyond the output it keeps, even while its
// command is quiet; past the head, through a lent buffer.
func (l *lockedHeadTail) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	var bp *[]byte
	defer func() {
		if bp != nil {
			copyBufs.Put(bp)
		}
	}()
	for {
		h, room := l.headRoom()
		var k int
		var err error
		if len(room) > 0 {
			k, err = r.Read(room)
			l.commitHead(h, k)
		} else {
			if bp == nil {
				bp = copyBufs.Get().(*[]byte)
			}
			k, err = r.Read(*bp)
			if k > 0 {
				_, _ = l.Write((*bp)[:k])
			}
		}
		n += int64(k)
		switch {
		case errors.Is(err, io.EOF):
			return n, nil
		case err != nil:
			return n, err
		}
	}
}

// headRoom returns the head's free capacity (grown when it has none, as
// appendBounded grows it), which only the reader writes and the others do
// not read: a snapshot reads the head up to its length.
func (l *lockedHeadTail) headRoom() (*headTail, []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.h
	if len(h.head) >= h.headCap {
		return h, nil
	}
	if len(h.head) == cap(h.head) {
		nb := make([]byte, len(h.head), min(max(2*cap(h.head), minGrow), h.headCap))
		copy(nb, h.head)
		h.head = nb
	}
	return h, h.head[len(h.head):cap(h.head)]
}

// commitHead counts k bytes read into h's head room, unless the buffers
// were released meanwhile.
func (l *lockedHeadTail) commitHead(h *headTail, k int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == h {
		h.head = h.head[:len(h.head)+k]
		h.total += int64(k)
	}
}

// release frees the buffers once the result holds what they had.
func (l *lockedHeadTail) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h = newHeadTail(l.h.limit)
}

func (l *lockedHeadTail) snapshot() (s string, truncated bool, total int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.String(), l.h.Truncated(), l.h.total
}
