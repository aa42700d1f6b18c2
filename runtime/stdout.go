package runtime

import (
	"bufio"
	"errors"
	"io"
	"sync"
)

// MaxLineBytes is the longest stdout line a managed process may print; the
// relay closes with 1009 on a longer one.
const MaxLineBytes = 16 << 20

// freeLineBytes of each unfinished line are not charged to the shared
// budget, so one process hoarding it cannot make every other process's
// ordinary lines drop.
const freeLineBytes = 64 << 10

// Line is one stdout line without its newline. TooLong marks a line that
// was dropped unfinished, its data discarded: longer than MaxLineBytes, or
// (OverBudget) growing past what the unfinished-line budget had left.
type Line struct {
	Data       []byte
	TooLong    bool
	OverBudget bool
}

// lineBudget bounds the memory that the unfinished stdout lines of all
// managed processes hold together (limits.relay_line_buffer_bytes): without
// it every process could sit on a 16 MiB partial line.
type lineBudget struct {
	limit func() int

	mu   sync.Mutex
	used int
}

func newLineBudget(limit func() int) *lineBudget { return &lineBudget{limit: limit} }

// reserve takes n bytes if the budget has them.
func (b *lineBudget) reserve(n int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.limit() {
		return false
	}
	b.used += n
	return true
}

func (b *lineBudget) release(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
}

// lineHub drains a managed process's stdout continuously, line by line, and
// hands each line to the current attachment, or keeps it in a bounded replay
// buffer while nobody is attached. The latest attacher takes over.
//
// Lines for an attachment wait in its queue, which the relay empties a
// batch at a time: one hand-off (and one socket write) per batch instead of
// one per line. The queue and the batch being sent are held to the replay
// bounds together; when they are full the pump stops reading, so a slow
// reader holds the process back instead of growing boxrt's memory.
type lineHub struct {
	mu          sync.Mutex
	cur         *Attachment
	replay      []Line
	replayBytes int
	maxLines    int
	maxBytes    int
	dropped     int
	eof         bool
	budget      *lineBudget
	onLine      func()
	onDrop      func(overBudget bool)
}

// newLineHub returns a hub whose replay buffer keeps at most maxLines lines
// and maxBytes bytes and whose unfinished lines draw on budget. It calls
// onLine for every line read, and onDrop as soon as it starts discarding
// one (the line may not end for a long time).
func newLineHub(maxLines, maxBytes int, budget *lineBudget, onLine func(), onDrop func(overBudget bool)) *lineHub {
	return &lineHub{maxLines: maxLines, maxBytes: maxBytes, budget: budget, onLine: onLine, onDrop: onDrop}
}

// Attachment is one relay's view of the stream. Backlog is delivered first,
// then the live lines: Ready is signalled when Take has lines for it or the
// process's stdout has ended. TakenOver is closed when a later attacher
// replaced this one.
type Attachment struct {
	Backlog   []Line
	Dropped   int
	Ready     <-chan struct{}
	TakenOver chan struct{}

	ready chan struct{} // Ready; one token, sent by the pump
	space chan struct{} // one token, sent by Take to a pump waiting for room
	gone  chan struct{}
	once  sync.Once
	hub   *lineHub

	// Guarded by hub.mu: the lines waiting to be taken, how many lines and
	// bytes they and the batch last taken hold together, and whether the
	// stream ended while this attachment was current.
	queue      []Line
	ended      bool
	heldLines  int
	heldBytes  int
	takenLines int
	takenBytes int
}

// pump reads r until EOF.
func (h *lineHub) pump(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br, MaxLineBytes, h.budget, h.onDrop)
		if len(line.Data) > 0 || line.TooLong || err == nil {
			h.deliver(line)
		}
		if err != nil {
			break
		}
	}
	h.mu.Lock()
	h.eof = true
	if a := h.cur; a != nil {
		a.ended = true
		signal(a.ready)
	}
	h.mu.Unlock()
}

// readLine returns the next line without "\n". A line longer than limit,
// or one whose growth past freeLineBytes the budget cannot cover, is
// skipped to its end and reported TooLong. The line's buffer is charged to
// the budget while it is unfinished and released once it is returned: from
// then on the replay bounds account for it. dropped is called when the
// line starts being skipped.
func readLine(br *bufio.Reader, limit int, budget *lineBudget, dropped func(overBudget bool)) (Line, error) {
	var l Line
	charged := 0
	defer func() { budget.release(charged) }()
	for {
		chunk, err := br.ReadSlice('\n')
		if !l.TooLong {
			need := len(l.Data) + len(chunk)
			if need > cap(l.Data) && need <= limit+1 {
				l.Data, charged, l.OverBudget = grow(l.Data, need, limit+1, charged, budget)
			}
			if need > limit+1 || l.OverBudget {
				l.TooLong, l.Data = true, nil
				budget.release(charged)
				charged = 0
				if dropped != nil {
					dropped(l.OverBudget)
				}
			} else {
				l.Data = append(l.Data, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n := len(l.Data); n > 0 && l.Data[n-1] == '\n' {
			l.Data = l.Data[:n-1]
		}
		return l, err
	}
}

// grow gives buf room for need bytes (doubling, at most limit), charging
// the capacity beyond freeLineBytes to budget. It reports overBudget,
// leaving buf alone, when the budget cannot cover the growth.
func grow(buf []byte, need, limit, charged int, budget *lineBudget) ([]byte, int, bool) {
	newCap := max(min(limit, 2*cap(buf)), need)
	if charge := max(0, newCap-freeLineBytes); charge > charged {
		if !budget.reserve(charge - charged) {
			return buf, charged, true
		}
		charged = charge
	}
	grown := make([]byte, len(buf), newCap)
	copy(grown, buf)
	return grown, charged, false
}

func (h *lineHub) deliver(l Line) {
	if h.onLine != nil {
		h.onLine()
	}
	for {
		h.mu.Lock()
		a := h.cur
		if a == nil {
			h.keep(l)
			h.mu.Unlock()
			return
		}
		if a.heldLines == 0 || (a.heldLines < h.maxLines && a.heldBytes+len(l.Data) <= h.maxBytes) {
			a.queue = append(a.queue, l)
			a.heldLines++
			a.heldBytes += len(l.Data)
			h.mu.Unlock()
			signal(a.ready)
			return
		}
		h.mu.Unlock()
		select {
		case <-a.space:
		case <-a.gone:
			// Detached meanwhile: look again (a new attacher may exist).
		}
	}
}

// signal leaves a token in a one-slot channel unless one is there already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Take returns the lines queued since the previous Take, and whether the
// stream has ended (no line will follow them). Calling it again means the
// lines it returned before were sent: their room goes back to the pump. So
// after Ready, call Take until it returns no lines; a batch never
// released would stall the pump.
func (a *Attachment) Take() ([]Line, bool) {
	h := a.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	a.heldLines -= a.takenLines
	a.heldBytes -= a.takenBytes
	// What is held now is the queue, which becomes the batch taken.
	a.takenLines, a.takenBytes = a.heldLines, a.heldBytes
	lines := a.queue
	a.queue = nil
	signal(a.space)
	return lines, a.ended
}

// keep appends to the replay buffer, dropping the oldest lines past the
// bounds. h.mu is held.
func (h *lineHub) keep(l Line) {
	h.replay = append(h.replay, l)
	h.replayBytes += len(l.Data)
	for len(h.replay) > 0 && (len(h.replay) > h.maxLines || h.replayBytes > h.maxBytes) {
		h.replayBytes -= len(h.replay[0].Data)
		h.replay[0] = Line{}
		h.replay = h.replay[1:]
		h.dropped++
	}
}

// attach makes a new attachment current, taking over from the previous one,
// and hands it the replay buffer.
func (h *lineHub) attach() *Attachment {
	h.mu.Lock()
	defer h.mu.Unlock()
	if prev := h.cur; prev != nil {
		h.cur = nil
		close(prev.TakenOver)
		prev.once.Do(func() { close(prev.gone) })
		// What the previous attacher had not taken yet is the new one's.
		for _, l := range prev.queue {
			h.keep(l)
		}
		prev.queue = nil
	}
	ready := make(chan struct{}, 1)
	a := &Attachment{
		Backlog:   h.replay,
		Dropped:   h.dropped,
		Ready:     ready,
		TakenOver: make(chan struct{}),
		ready:     ready,
		space:     make(chan struct{}, 1),
		gone:      make(chan struct{}),
		hub:       h,
	}
	// The backlog counts as the first batch taken: until the relay has sent
	// it, it holds the room the queue would otherwise get.
	a.heldLines, a.heldBytes = len(h.replay), h.replayBytes
	a.takenLines, a.takenBytes = a.heldLines, a.heldBytes
	h.replay, h.replayBytes, h.dropped = nil, 0, 0
	if h.eof {
		a.ended = true
		signal(ready)
	} else {
		h.cur = a
	}
	return a
}

// Detach ends the attachment. unsent are lines it took but could not
// deliver (the socket died mid-write); they go back to the front of the
// replay buffer, followed by the lines still queued, so the next attacher
// still gets them.
func (a *Attachment) Detach(unsent ...Line) {
	h := a.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == a {
		h.cur = nil
	}
	a.once.Do(func() { close(a.gone) })
	back := append(append(make([]Line, 0, len(unsent)+len(a.queue)), unsent...), a.queue...)
	a.queue = nil
	if len(back) > 0 {
		rest := h.replay
		h.replay = nil
		h.replayBytes = 0
		for _, l := range append(back, rest...) {
			h.keep(l)
		}
	}
}

func (h *lineHub) attached() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cur != nil
}

func (h *lineHub) pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.replay)
}
