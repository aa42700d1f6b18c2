package runtime

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// headTail keeps at most limit bytes of a stream: the first 60 % and the
// last 40 %, counting everything it was given. Memory is bounded by limit
// whatever the command prints, and is allocated as output arrives: most
// commands print a few bytes, and reserving the whole cap for each of the
// two streams of every exec in flight made a burst of concurrent execs cost
// hundreds of megabytes for nothing.
type headTail struct {
	limit   int
	headCap int // the head holds at most this many bytes
	tailCap int // the tail ring holds at most this many bytes
	head    []byte
	tail    []byte // grows until tailCap, then is a ring buffer
	tailPos int    // oldest byte of the ring once len(tail) == tailCap
	total   int64
}

// minGrow is the first allocation of a buffer: enough for the typical
// short output in one step, small enough not to matter per exec.
const minGrow = 512

func newHeadTail(limit int) *headTail {
	headCap := limit * 6 / 10
	return &headTail{limit: limit, headCap: headCap, tailCap: limit - headCap}
}

// appendBounded appends p to b, growing its capacity geometrically (so the
// copying stays amortised O(n)) but never past bound. The caller makes sure
// len(b)+len(p) <= bound.
func appendBounded(b, p []byte, bound int) []byte {
	need := len(b) + len(p)
	if need > cap(b) {
		c := min(max(2*cap(b), need, minGrow), bound)
		nb := make([]byte, len(b), c)
		copy(nb, b)
		b = nb
	}
	return append(b, p...)
}

func (h *headTail) Write(p []byte) (int, error) {
	n := len(p)
	h.total += int64(n)
	if room := h.headCap - len(h.head); room > 0 {
		take := min(room, len(p))
		h.head = appendBounded(h.head, p[:take], h.headCap)
		p = p[take:]
	}
	if h.tailCap == 0 || len(p) == 0 {
		return n, nil
	}
	if len(p) >= h.tailCap {
		// Only the last tailCap bytes survive: the ring restarts full.
		h.tail = appendBounded(h.tail[:0], p[len(p)-h.tailCap:], h.tailCap)
		h.tailPos = 0
		return n, nil
	}
	if room := h.tailCap - len(h.tail); room > 0 {
		take := min(room, len(p))
		h.tail = appendBounded(h.tail, p[:take], h.tailCap)
		p = p[take:]
	}
	for len(p) > 0 { // the ring is full: overwrite the oldest bytes
		c := copy(h.tail[h.tailPos:], p)
		h.tailPos = (h.tailPos + c) % h.tailCap
		p = p[c:]
	}
	return n, nil
}

// Truncated reports whether bytes were dropped.
func (h *headTail) Truncated() bool { return h.total > int64(h.limit) }

// String returns the kept output as valid UTF-8 (invalid sequences become
// U+FFFD, nothing is stripped), with a marker naming the dropped byte count
// between head and tail when the stream was longer than the limit.
func (h *headTail) String() string {
	if !h.Truncated() {
		// Everything fits: one allocation for the result (ToValidUTF8
		// returns valid input as is).
		var sb strings.Builder
		sb.Grow(len(h.head) + len(h.tail))
		sb.Write(h.head)
		sb.Write(h.tail[h.tailPos:])
		sb.Write(h.tail[:h.tailPos])
		return strings.ToValidUTF8(sb.String(), "\uFFFD")
	}
	tail := make([]byte, 0, len(h.tail))
	tail = append(tail, h.tail[h.tailPos:]...)
	tail = append(tail, h.tail[:h.tailPos]...)
	head := h.head
	// Cut on rune boundaries so the cut itself does not produce U+FFFD.
	for i := 0; i < utf8.UTFMax && len(head) > 0 && !utf8.FullRune(head[lastRuneStart(head):]); i++ {
		head = head[:lastRuneStart(head)]
	}
	for i := 0; i < utf8.UTFMax && len(tail) > 0 && !utf8.RuneStart(tail[0]); i++ {
		tail = tail[1:]
	}
	dropped := h.total - int64(len(head)) - int64(len(tail))
	marker := fmt.Sprintf("\n... [boxrt: %d bytes omitted; %d bytes in total] ...\n", dropped, h.total)
	return strings.ToValidUTF8(string(head), "\uFFFD") + marker + strings.ToValidUTF8(string(tail), "\uFFFD")
}

func lastRuneStart(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return len(b) - 1
}
