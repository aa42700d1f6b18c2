package reconnect

import (
	"sort"
	"sync"
	"testing"
	"time"
)

// fakeClock is a manual Clock: time moves only in Advance.
type fakeClock struct {
	mu        sync.Mutex
	now       time.Time
	pending   map[*fakeTimer]struct{}
	requested []time.Duration // durations of every timer made, in order
}

type fakeTimer struct {
	clk  *fakeClock
	when time.Time
	d    time.Duration
	ch   chan time.Time
	f    func()
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), pending: map[*fakeTimer]struct{}{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration, f func()) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clk: c, when: c.now.Add(d), d: d, f: f}
	if f == nil {
		t.ch = make(chan time.Time, 1)
	}
	c.pending[t] = struct{}{}
	c.requested = append(c.requested, d)
	return t
}

func (c *fakeClock) NewTimer(d time.Duration) Timer            { return c.add(d, nil) }
func (c *fakeClock) AfterFunc(d time.Duration, f func()) Timer { return c.add(d, f) }

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	_, ok := t.clk.pending[t]
	delete(t.clk.pending, t)
	return ok
}

// Advance moves time forward and fires the timers that came due, in order.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for t := range c.pending {
		if !t.when.After(c.now) {
			due = append(due, t)
			delete(c.pending, t)
		}
	}
	now := c.now
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].when.Before(due[j].when) })
	for _, t := range due {
		if t.f != nil {
			t.f()
		} else {
			t.ch <- now
		}
	}
}

// waitPending waits until a timer of duration d is pending and returns it.
func (c *fakeClock) waitPending(t *testing.T, d time.Duration) {
	t.Helper()
	waitFor(t, 5*time.Second, "a pending "+d.String()+" timer", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for p := range c.pending {
			if p.d == d {
				return true
			}
		}
		return false
	})
}

// waitAnyPending waits for a pending timer and returns its duration.
func (c *fakeClock) waitAnyPending(t *testing.T) time.Duration {
	t.Helper()
	var d time.Duration
	waitFor(t, 5*time.Second, "a pending timer", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for p := range c.pending {
			d = p.d
			return true
		}
		return false
	})
	return d
}

func (c *fakeClock) pendingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}
