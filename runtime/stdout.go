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

// Line is one stdout line without its newline. TooLong marks a line that
// exceeded MaxLineBytes; its data was discarded.
type Line struct {
	Data    []byte
	TooLong bool
}

// lineHub drains a managed process's stdout continuously, line by line, and
// hands each line to the current attachment, or keeps it in a bounded replay
// buffer while nobody is attached. The latest attacher takes over.
type lineHub struct {
	mu          sync.Mutex
	cur         *Attachment
	replay      []Line
	replayBytes int
	maxLines    int
	maxBytes    int
	dropped     int
	eof         bool
	onLine      func()
}

func newLineHub(maxLines, maxBytes int, onLine func()) *lineHub {
	return &lineHub{maxLines: maxLines, maxBytes: maxBytes, onLine: onLine}
}

// Attachment is one relay's view of the stream. Backlog is delivered first,
// then Lines; Lines is closed once the process's stdout ended. TakenOver is
// closed when a later attacher replaced this one.
type Attachment struct {
	Backlog   []Line
	Dropped   int
	Lines     chan Line
	TakenOver chan struct{}
	gone      chan struct{}
	once      sync.Once
	hub       *lineHub
}

// pump reads r until EOF. It is the only sender on attachment channels.
func (h *lineHub) pump(r io.Reader) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, tooLong, err := readLine(br, MaxLineBytes)
		if len(line) > 0 || tooLong || err == nil {
			h.deliver(Line{Data: line, TooLong: tooLong})
		}
		if err != nil {
			break
		}
	}
	h.mu.Lock()
	h.eof = true
	if h.cur != nil {
		close(h.cur.Lines)
	}
	h.mu.Unlock()
}

// readLine returns the next line without "\n"; a line longer than limit is
// skipped to its end and reported as tooLong.
func readLine(br *bufio.Reader, limit int) ([]byte, bool, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > limit+1 {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n := len(line); n > 0 && line[n-1] == '\n' {
			line = line[:n-1]
		}
		return line, tooLong, err
	}
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
		h.mu.Unlock()
		select {
		case a.Lines <- l:
			return
		case <-a.gone:
			// Detached meanwhile: look again (a new attacher may exist).
		}
	}
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
	}
	a := &Attachment{
		Backlog:   h.replay,
		Dropped:   h.dropped,
		Lines:     make(chan Line),
		TakenOver: make(chan struct{}),
		gone:      make(chan struct{}),
		hub:       h,
	}
	h.replay, h.replayBytes, h.dropped = nil, 0, 0
	if h.eof {
		close(a.Lines)
	} else {
		h.cur = a
	}
	return a
}

// Detach ends the attachment. unsent are lines it took but could not
// deliver (the socket died mid-write); they go back to the front of the
// replay buffer so the next attacher still gets them.
func (a *Attachment) Detach(unsent ...Line) {
	h := a.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == a {
		h.cur = nil
	}
	a.once.Do(func() { close(a.gone) })
	if len(unsent) > 0 {
		rest := h.replay
		h.replay = nil
		h.replayBytes = 0
		for _, l := range append(unsent, rest...) {
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
