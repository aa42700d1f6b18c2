package dialout

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Class says how a sent frame is kept for replay.
type Class int

const (
	// Keep: a frame the peer waits for (an answer, a request): kept up to
	// Limits.KeepFrames and Limits.KeepBytes; one evicted before the peer
	// got it is reported by its id.
	Keep Class = iota
	// Bulk: a notification (exec output): kept up to Limits.BulkBytes,
	// oldest dropped first; dropped ones are counted.
	Bulk
)

// Limits bound what a logical connection keeps for replay. The buffer
// holds the last frames sent whether or not the peer already has them
// (there are no acknowledgements besides the handshake's count), so these
// are also its steady-state memory.
type Limits struct {
	KeepFrames int
	KeepBytes  int
	BulkBytes  int
}

// DefaultLimits: a 16 MiB message (the JSON-RPC limit) fits, and up to
// 1024 answers; 1 MiB of notifications, about 60 chunks of exec output.
var DefaultLimits = Limits{KeepFrames: 1024, KeepBytes: 16 << 20, BulkBytes: 1 << 20}

// evictedMax bounds the record of evicted frames of each class; past it
// the oldest records, the likeliest to have been received, are forgotten.
// Answers outstanding at once are bounded by the runtime's in-flight limit
// (128 per connection), far below it; for notifications only the count
// matters.
const evictedMax = 4096

// evictions is a ring of the last evictedMax evictions of a class: it
// grows up to that, then head is its oldest entry.
type evictions struct {
	items []lostFrame
	head  int
}

func (e *evictions) add(f lostFrame) {
	if len(e.items) < evictedMax {
		e.items = append(e.items, f)
		return
	}
	e.items[e.head] = f
	e.head = (e.head + 1) % evictedMax
}

func (e *evictions) reset() {
	clear(e.items)
	e.items, e.head = e.items[:0], 0
}

type sent struct {
	seq   uint64
	frame []byte
}

type queue struct {
	items []sent
	bytes int
}

func (q *queue) push(s sent) {
	q.items = append(q.items, s)
	q.bytes += len(s.frame)
}

func (q *queue) pop() sent {
	s := q.items[0]
	q.items[0] = sent{}
	q.items = q.items[1:]
	q.bytes -= len(s.frame)
	return s
}

// dropThrough forgets the frames the peer has (seq ≤ n).
func (q *queue) dropThrough(n uint64) {
	for len(q.items) > 0 && q.items[0].seq <= n {
		q.pop()
	}
}

// lostFrame is an evicted frame: its id for a Keep frame, nil for Bulk.
type lostFrame struct {
	seq uint64
	id  json.RawMessage
}

// replay is a logical connection's sent frames, by class.
type replay struct {
	lim        Limits
	keep, bulk queue
	// evictedKeep and evictedBulk record what the queues dropped.
	evictedKeep, evictedBulk evictions
}

// add keeps a copy of frame, which it returns.
func (r *replay) add(seq uint64, frame []byte, c Class) []byte {
	s := sent{seq: seq, frame: append([]byte(nil), frame...)}
	if c == Bulk {
		r.bulk.push(s)
		for r.bulk.bytes > r.lim.BulkBytes && len(r.bulk.items) > 1 {
			r.evictedBulk.add(lostFrame{seq: r.bulk.pop().seq})
		}
		return s.frame
	}
	r.keep.push(s)
	for (r.keep.bytes > r.lim.KeepBytes || len(r.keep.items) > r.lim.KeepFrames) && len(r.keep.items) > 1 {
		e := r.keep.pop()
		r.evictedKeep.add(lostFrame{e.seq, frameID(e.frame)})
	}
	return s.frame
}

// AnswersLostNotification is what the runtime sends after a resumption
// that could not replay everything: params {"ids": [the ids of the answers
// lost], "notifications_lost": n}.
const AnswersLostNotification = "box_answers_lost"

// Lost is what a resumption could not replay: the ids of Keep frames and
// the number of Bulk frames evicted before the peer got them.
type Lost struct {
	IDs  []json.RawMessage
	Bulk int
}

// since returns the frames after peer's count n (peer got 1..n), in order,
// and what of them was evicted; it forgets everything up to n. last is the
// highest seq sent: a peer claiming more is lying or confused.
func (r *replay) since(n, last uint64) ([][]byte, Lost, error) {
	if n > last {
		return nil, Lost{}, fmt.Errorf("the peer claims %d frames received of %d sent", n, last)
	}
	r.keep.dropThrough(n)
	r.bulk.dropThrough(n)
	var lost Lost
	for _, e := range r.evictedKeep.items {
		if e.seq > n && e.id != nil {
			lost.IDs = append(lost.IDs, e.id)
		}
	}
	for _, e := range r.evictedBulk.items {
		if e.seq > n {
			lost.Bulk++
		}
	}
	r.evictedKeep.reset()
	r.evictedBulk.reset()
	frames := make([][]byte, 0, len(r.keep.items)+len(r.bulk.items))
	k, b := r.keep.items, r.bulk.items
	for len(k) > 0 || len(b) > 0 {
		if len(b) == 0 || (len(k) > 0 && k[0].seq < b[0].seq) {
			frames, k = append(frames, k[0].frame), k[1:]
		} else {
			frames, b = append(frames, b[0].frame), b[1:]
		}
	}
	return frames, lost, nil
}

// The layouts whose numeric ids frameID reads without decoding: boxrt's
// answers start with the id; the host's requests (jsonrpc2's encoding)
// end with it and the version.
var (
	answerPrefix  = []byte(`{"jsonrpc":"2.0","id":`)
	requestSuffix = []byte(`,"jsonrpc":"2.0"}`)
	idMember      = []byte(`"id":`)
)

// frameID is a JSON-RPC message's id, nil if it has none. A numeric id in
// one of the known layouts is read without decoding the message
// (evictions are on the hot path); anything else is decoded.
func frameID(frame []byte) json.RawMessage {
	if rest, ok := bytes.CutPrefix(frame, answerPrefix); ok {
		if n := numberLen(rest); n > 0 && n < len(rest) && rest[n] == ',' && json.Valid(rest[:n]) {
			return append(json.RawMessage(nil), rest[:n]...)
		}
	} else if head, ok := bytes.CutSuffix(frame, requestSuffix); ok {
		// The very end of an object is its last members, never the
		// inside of a string: "id":N is the request's own.
		i := len(head)
		for i > 0 && (head[i-1] == '-' || isDigit(head[i-1])) {
			i--
		}
		if i < len(head) && bytes.HasSuffix(head[:i], idMember) && json.Valid(head[i:]) {
			return append(json.RawMessage(nil), head[i:]...)
		}
	}
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(frame, &m) != nil || len(m.ID) == 0 || string(m.ID) == "null" {
		return nil
	}
	return m.ID
}

// numberLen is the length of the integer b starts with.
func numberLen(b []byte) int {
	n := 0
	for n < len(b) && (b[n] == '-' || isDigit(b[n])) {
		n++
	}
	return n
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
