package rpc

import (
	"sync"
	"time"
)

// Defaults of a connection's scheduler.
const (
	// DefaultMaxInFlight is the per-connection limit of requests running
	// at once; the ones past it wait in the connection's queue.
	DefaultMaxInFlight = 128
	// DefaultMaxPerKey is how many requests of one key (one session) run
	// at once: the rest of that session's requests wait their turn, so a
	// session with hundreds of calls does not hold every slot while its
	// own calls wait for each other (execs on a session are serialised).
	DefaultMaxPerKey = 4
	// DefaultMaxQueued bounds the requests waiting on one connection;
	// past it (or past DefaultMaxQueuedBytes of their params) a request is
	// refused with BoxCapacityExceededError.
	DefaultMaxQueued = 4096
	// DefaultMaxQueuedBytes bounds the params waiting on one connection:
	// a queue of large requests is full before its count is reached.
	DefaultMaxQueuedBytes = 32 << 20
)

// Retry hints of a refusal: retry_after_ms is the time the queue ahead
// should take to drain, from the mean run time of recent calls, within
// these bounds.
const (
	minRetryAfter = 50 * time.Millisecond
	maxRetryAfter = 30 * time.Second
)

// queued is a request waiting for its turn, or running.
type queued struct {
	call *asyncCall
	key  string
	size int
	at   time.Time
}

// keyQueue is one key's waiting requests, oldest first, and how many of
// its requests run.
type keyQueue struct {
	key     string
	running int
	waiting []*queued
	inRing  bool
}

// scheduler decides when a connection's requests run: at most maxRunning
// at once and maxPerKey of one key at once; the others wait in per-key
// FIFOs served round-robin, so every key with a waiting request gets the
// next free slot in turn however many requests another key has queued.
// It holds no goroutine: a request starts on the goroutine that admitted
// it or that finished the request before it.
type scheduler struct {
	maxRunning, maxPerKey  int
	maxQueued, maxQueuedSz int

	mu      sync.Mutex
	running int
	waiting int
	bytes   int
	keys    map[string]*keyQueue
	// ring holds the keys with a waiting request that may run (below
	// maxPerKey), in turn order. Non-empty only while running ==
	// maxRunning.
	ring   []*keyQueue
	closed bool
	// meanRun is an exponentially weighted mean of run times, for the
	// retry hint.
	meanRun time.Duration
}

func newScheduler(maxRunning, maxPerKey, maxQueued, maxQueuedBytes int) *scheduler {
	return &scheduler{
		maxRunning: max(maxRunning, 1), maxPerKey: max(maxPerKey, 1),
		maxQueued: maxQueued, maxQueuedSz: maxQueuedBytes,
		keys: map[string]*keyQueue{},
	}
}

// admit takes q: run reports that q may start now; otherwise it waits
// (ok) or the queue is full (!ok, with a retry hint).
func (s *scheduler) admit(q *queued) (run, ok bool, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false, false, 0
	}
	k := s.keys[q.key]
	if k == nil {
		k = &keyQueue{key: q.key}
		s.keys[q.key] = k
	}
	if s.running < s.maxRunning && k.running < s.perKey(k.key) && len(k.waiting) == 0 {
		s.running++
		k.running++
		return true, true, 0
	}
	if s.waiting >= s.maxQueued || (s.waiting > 0 && s.bytes+q.size > s.maxQueuedSz) {
		s.dropIdle(k)
		return false, false, s.retryAfterLocked()
	}
	k.waiting = append(k.waiting, q)
	s.waiting++
	s.bytes += q.size
	if k.running < s.perKey(k.key) && !k.inRing {
		s.pushRing(k)
	}
	return false, true, 0
}

// done ends a running request of key that ran for took and returns the
// request that may start in its slot, if one waits.
func (s *scheduler) done(key string, took time.Duration) *queued {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.running--
	k := s.keys[key]
	k.running--
	if s.meanRun == 0 {
		s.meanRun = took
	} else {
		s.meanRun += (took - s.meanRun) / 8
	}
	if len(k.waiting) > 0 && !k.inRing && k.running < s.perKey(k.key) {
		s.pushRing(k)
	}
	s.dropIdle(k)
	if s.closed {
		return nil
	}
	return s.nextLocked()
}

// nextLocked starts the next request in turn, if a slot is free.
func (s *scheduler) nextLocked() *queued {
	if s.running >= s.maxRunning || len(s.ring) == 0 {
		return nil
	}
	k := s.ring[0]
	s.ring[0] = nil
	s.ring = s.ring[1:]
	k.inRing = false
	q := k.waiting[0]
	k.waiting[0] = nil
	k.waiting = k.waiting[1:]
	if len(k.waiting) == 0 {
		k.waiting = nil // let the backing array go
	}
	s.waiting--
	s.bytes -= q.size
	s.running++
	k.running++
	if len(k.waiting) > 0 && k.running < s.perKey(k.key) {
		s.pushRing(k)
	}
	return q
}

// perKey is the running bound of key; requests without a key (no
// session) share only the connection's bound.
func (s *scheduler) perKey(key string) int {
	if key == "" {
		return s.maxRunning
	}
	return s.maxPerKey
}

func (s *scheduler) pushRing(k *keyQueue) {
	k.inRing = true
	s.ring = append(s.ring, k)
}

func (s *scheduler) dropIdle(k *keyQueue) {
	if k.running == 0 && len(k.waiting) == 0 {
		delete(s.keys, k.key)
	}
}

// retryAfterLocked is how long the requests ahead should take to drain.
func (s *scheduler) retryAfterLocked() time.Duration {
	d := time.Duration(int64(s.meanRun) * int64(s.waiting+s.running) / int64(s.maxRunning))
	return min(max(d, minRetryAfter), maxRetryAfter)
}

// close refuses later admissions and returns the requests still waiting,
// which will never run.
func (s *scheduler) close() []*queued {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var left []*queued
	for _, k := range s.keys {
		left = append(left, k.waiting...)
		k.waiting = nil
		s.dropIdle(k)
	}
	s.ring = nil
	s.waiting, s.bytes = 0, 0
	return left
}

// depth reports the requests running and waiting, for tests.
func (s *scheduler) depth() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, s.waiting
}
