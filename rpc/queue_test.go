package rpc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSchedulerOrder drives the scheduler alone: which requests start at
// once, which wait, which are refused, and the order the waiting ones
// start in as slots free.
func TestSchedulerOrder(t *testing.T) {
	type step struct {
		admit string // a key to admit ("-" for none)
		done  string // or a key whose oldest running request ends
	}
	for _, tc := range []struct {
		name                       string
		running, perKey, maxQueued int
		steps                      []step
		// started lists the keys in the order their requests started;
		// refused the keys refused.
		started, refused []string
	}{
		{name: "under the bound everything starts", running: 4, perKey: 4, maxQueued: 4,
			steps:   []step{{admit: "a"}, {admit: "b"}, {admit: "a"}},
			started: []string{"a", "b", "a"}},
		{name: "past the bound requests wait and start in order", running: 1, perKey: 4, maxQueued: 4,
			steps:   []step{{admit: "a"}, {admit: "a"}, {admit: "a"}, {done: "a"}, {done: "a"}},
			started: []string{"a", "a", "a"}},
		{name: "a full queue refuses", running: 1, perKey: 1, maxQueued: 2,
			steps: []step{{admit: "a"}, {admit: "a"}, {admit: "b"}, {admit: "c"}, {done: "a"}, {admit: "d"}},
			// b waited, a's second waited too, but a just ran: b's turn.
			started: []string{"a", "b"}, refused: []string{"c"}},
		{name: "a busy key does not starve the others", running: 2, perKey: 2, maxQueued: 100,
			steps: []step{{admit: "a"}, {admit: "a"}, {admit: "a"}, {admit: "a"}, {admit: "a"}, {admit: "b"}, {admit: "c"},
				{done: "a"}, {done: "a"}, {done: "b"}},
			// b and c were queued after three more of a's, yet take the
			// next two turns; then a's turn again.
			started: []string{"a", "a", "b", "c", "a"}},
		{name: "one key runs at most perKey at once", running: 8, perKey: 2, maxQueued: 100,
			steps:   []step{{admit: "a"}, {admit: "a"}, {admit: "a"}, {admit: "b"}, {done: "a"}},
			started: []string{"a", "a", "b", "a"}},
		{name: "requests without a key share only the connection's bound", running: 3, perKey: 1, maxQueued: 100,
			steps:   []step{{admit: ""}, {admit: ""}, {admit: ""}, {admit: ""}},
			started: []string{"", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newScheduler(tc.running, tc.perKey, tc.maxQueued, 1<<20)
			var started, refused []string
			for _, st := range tc.steps {
				if st.done != "" {
					if q := s.done(st.done, time.Millisecond); q != nil {
						started = append(started, q.key)
					}
					continue
				}
				run, ok, retry := s.admit(&queued{key: st.admit, size: 10})
				switch {
				case run:
					started = append(started, st.admit)
				case !ok:
					assert.GreaterOrEqual(t, retry, minRetryAfter)
					refused = append(refused, st.admit)
				}
			}
			assert.Equal(t, tc.started, started)
			assert.Equal(t, tc.refused, refused)
		})
	}
}

// TestSchedulerBytes: the waiting params are bounded in bytes too; a
// request larger than the bound still waits alone.
func TestSchedulerBytes(t *testing.T) {
	s := newScheduler(1, 1, 100, 100)
	run, _, _ := s.admit(&queued{key: "a", size: 1})
	require.True(t, run)
	_, ok, _ := s.admit(&queued{key: "a", size: 500})
	assert.True(t, ok, "the first waiting request may exceed the bound alone")
	_, ok, retry := s.admit(&queued{key: "b", size: 1})
	assert.False(t, ok)
	assert.Equal(t, minRetryAfter, retry)
	assert.NotNil(t, s.done("a", time.Millisecond))
	_, ok, _ = s.admit(&queued{key: "b", size: 1})
	assert.True(t, ok, "the large request left the queue when it started")
}

// TestSchedulerClose: the waiting requests are handed back, nothing more
// is admitted, and the running ones start no successor.
func TestSchedulerClose(t *testing.T) {
	s := newScheduler(1, 1, 10, 1<<20)
	s.admit(&queued{key: "a"})
	s.admit(&queued{key: "a"})
	s.admit(&queued{key: "b"})
	assert.Len(t, s.close(), 2)
	assert.Nil(t, s.done("a", time.Millisecond))
	_, ok, retry := s.admit(&queued{key: "c"})
	assert.False(t, ok)
	assert.Zero(t, retry, "a closed connection answers nothing")
	running, waiting := s.depth()
	assert.Zero(t, running)
	assert.Zero(t, waiting)
	assert.Empty(t, s.keys)
}

// keyedHandler blocks "wait" calls until their key's channel is closed and
// records the order calls started in.
type keyedHandler struct {
	mu      sync.Mutex
	release map[string]chan struct{}
	started []string
}

func (h *keyedHandler) gate(key string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.release[key] == nil {
		h.release[key] = make(chan struct{})
	}
	return h.release[key]
}

func (h *keyedHandler) Handle(ctx context.Context, req *Request) (json.RawMessage, error) {
	key := testKey(req)
	h.mu.Lock()
	h.started = append(h.started, key)
	h.mu.Unlock()
	select {
	case <-h.gate(key):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return json.RawMessage(`"` + key + `"`), nil
}

func testKey(req *Request) string {
	var p struct {
		K string `json:"k"`
	}
	_ = json.Unmarshal(req.Params, &p)
	return p.K
}

// TestQueueOnConnection: a burst past the running bound is queued and
// answered in full; another key's request overtakes a busy key's backlog;
// the queue-full refusal is typed, retryable and says when to retry.
func TestQueueOnConnection(t *testing.T) {
	h := &keyedHandler{release: map[string]chan struct{}{}}
	var waits []time.Duration
	var mu sync.Mutex
	c, stop := startStdio(t, h, WithMaxInFlight(2), WithQueueBounds(1, 5, 1<<20), WithQueueKey(testKey),
		WithObserver(func(call Call) { mu.Lock(); waits = append(waits, call.Waited); mu.Unlock() }))
	defer stop()
	go func() {
		// a and b run, a's next four wait, then c waits: the queue is full
		// (5), so d is refused.
		for i, k := range []string{"a", "b", "a", "a", "a", "a", "c", "d"} {
			fmt.Fprintf(c.w, `{"jsonrpc":"2.0","id":%d,"method":"wait","params":{"k":%q}}`+"\n", i, k)
		}
	}()
	r := c.read(t)
	assert.Equal(t, float64(7), r["id"], "d is refused at once")
	e := r["error"].(map[string]any)
	assert.Equal(t, float64(-32007), e["code"])
	assert.True(t, strings.HasPrefix(e["message"].(string), "BoxCapacityExceededError: Runtime connection queue is full"), e["message"])
	data := e["data"].(map[string]any)
	assert.Equal(t, true, data["retryable"])
	assert.Equal(t, QueueFullLimit, data["limit"])
	assert.GreaterOrEqual(t, data["retry_after_ms"], float64(minRetryAfter.Milliseconds()))

	require.Eventually(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return len(h.started) == 2 }, 5*time.Second, time.Millisecond)
	close(h.gate("b"))
	r = c.read(t)
	assert.Equal(t, "b", r["result"])
	close(h.gate("c"))
	r = c.read(t)
	assert.Equal(t, "c", r["result"], "c took b's slot ahead of a's backlog: a already runs one")
	close(h.gate("a"))
	for range 5 {
		assert.Equal(t, "a", c.read(t)["result"])
	}
	h.mu.Lock()
	assert.ElementsMatch(t, []string{"a", "b"}, h.started[:2], "a and b run at once, in either order")
	assert.Equal(t, []string{"c", "a", "a", "a", "a"}, h.started[2:])
	h.mu.Unlock()
	// The observer runs after the answer is written.
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(waits) == 8 }, 5*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	var queued int
	for _, w := range waits {
		if w > 0 {
			queued++
		}
	}
	assert.Equal(t, 5, queued, "the five that waited report their wait")
}

// TestQueueDroppedOnClose: requests still waiting when the connection
// ends never run and leak nothing (goleak in TestMain).
func TestQueueDroppedOnClose(t *testing.T) {
	h := &keyedHandler{release: map[string]chan struct{}{}}
	inR, inW := io.Pipe()
	s := NewServer(h, WithMaxInFlight(1), WithQueueKey(testKey))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.ServeStdio(ctx, inR, io.Discard); close(done) }()
	for i := range 10 {
		fmt.Fprintf(inW, `{"jsonrpc":"2.0","id":%d,"method":"wait","params":{"k":"a"}}`+"\n", i)
	}
	require.Eventually(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return len(h.started) == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	<-done
	inW.Close()
	h.mu.Lock()
	defer h.mu.Unlock()
	assert.Len(t, h.started, 1, "the waiting requests never ran")
}
