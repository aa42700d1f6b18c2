package runtime

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// headTail keeps at most limit bytes of a stream: the first 60 % and the
// last 40 %, counting everything it was given. Memory is bounded by limit
// whatever the command prints.
type headTail struct {
	limit   int
	head    []byte
	tail    []byte // ring buffer once full
	tailPos int
	total   int64
}

func newHeadTail(limit int) *headTail {
	headCap := limit * 6 / 10
	return &headTail{limit: limit, head: make([]byte, 0, headCap), tail: make([]byte, 0, limit-headCap)}
}

func (h *headTail) Write(p []byte) (int, error) {
	n := len(p)
	h.total += int64(n)
	if room := cap(h.head) - len(h.head); room > 0 {
		take := min(room, len(p))
		h.head = append(h.head, p[:take]...)
		p = p[take:]
	}
	tailCap := cap(h.tail)
	if tailCap == 0 {
		return n, nil
	}
	if len(p) >= tailCap {
		h.tail = append(h.tail[:0], p[len(p)-tailCap:]...)
		h.tailPos = 0
		return n, nil
	}
	for len(p) > 0 {
		if len(h.tail) < tailCap {
			take := min(tailCap-len(h.tail), len(p))
			h.tail = append(h.tail, p[:take]...)
			p = p[take:]
			continue
		}
		c := copy(h.tail[h.tailPos:], p)
		h.tailPos = (h.tailPos + c) % tailCap
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
	tail := make([]byte, 0, len(h.tail))
	tail = append(tail, h.tail[h.tailPos:]...)
	tail = append(tail, h.tail[:h.tailPos]...)
	if !h.Truncated() {
		return strings.ToValidUTF8(string(h.head)+string(tail), "\uFFFD")
	}
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
