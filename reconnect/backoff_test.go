package reconnect

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBackoffBase(t *testing.T) {
	s := time.Second
	tests := []struct {
		failures int
		want     time.Duration
	}{
		{0, 0}, {1, 3 * s}, {2, 6 * s}, {3, 12 * s}, {4, 24 * s}, {5, 48 * s}, {6, 60 * s}, {7, 60 * s}, {1000, 60 * s},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, backoffBase(tt.failures, 3*s, 60*s), "failures=%d", tt.failures)
	}
	assert.Equal(t, time.Duration(0), backoffBase(3, 0, time.Minute), "initial 0 never waits")
	assert.Equal(t, time.Duration(1<<62), backoffBase(200, time.Second, 1<<62), "no overflow near the int64 limit")
}

func TestBackoffDelayJitter(t *testing.T) {
	base := 10 * time.Second
	tests := []struct {
		u    float64
		want time.Duration
	}{
		{-1, 8 * time.Second}, {-0.5, 9 * time.Second}, {0, 10 * time.Second}, {0.5, 11 * time.Second},
	}
	for _, tt := range tests {
		// failures=1 with initial=base gives base itself.
		assert.Equal(t, tt.want, backoffDelay(1, base, time.Minute, 0.2, tt.u), "u=%v", tt.u)
	}
	assert.Equal(t, base, backoffDelay(1, base, time.Minute, 0, -1), "jitter 0 is exact")

	// Property: with the default ±20 %, every wait lies in [0.8, 1.2) × base.
	r := rand.New(rand.NewPCG(1, 2))
	for failures := 1; failures <= 10; failures++ {
		b := backoffBase(failures, DefaultBackoffInitial, DefaultBackoffMax)
		lo, hi := time.Duration(float64(b)*0.8), time.Duration(float64(b)*1.2)
		for range 2000 {
			d := backoffDelay(failures, DefaultBackoffInitial, DefaultBackoffMax, DefaultJitter, 2*r.Float64()-1)
			require.GreaterOrEqual(t, d, lo, "failures=%d", failures)
			require.Less(t, d, hi, "failures=%d", failures)
		}
	}
}

// failingClient starts a Client whose every connection attempt fails, on a
// fake clock, without waiting for a first connection.
func failingClient(t *testing.T, clk *fakeClock, opts ...Option) (*Client, *atomic.Int32) {
	t.Helper()
	var attempts atomic.Int32
	o := buildOptions(append([]Option{WithClock(clk), WithHeartbeat(0, 0, 1), WithLogger(testLogger())}, opts...))
	o.connector = func(context.Context) (*link, error) {
		attempts.Add(1)
		return nil, errors.New("connection refused")
	}
	c := newClient(o)
	go c.run()
	t.Cleanup(func() { _ = c.Close() })
	return c, &attempts
}

// TestBackoffSchedule drives the supervisor with a fake clock: each failed
// attempt must be followed by exactly one timer of the scheduled length,
// and no attempt may happen before that timer fires.
func TestBackoffSchedule(t *testing.T) {
	s := time.Second
	want := []time.Duration{3 * s, 6 * s, 12 * s, 24 * s, 48 * s, 60 * s, 60 * s, 60 * s}

	t.Run("exact without jitter", func(t *testing.T) {
		clk := newFakeClock()
		_, attempts := failingClient(t, clk, WithJitter(0))
		for i, w := range want {
			waitFor(t, 5*time.Second, "attempt", func() bool { return attempts.Load() == int32(i+1) })
			clk.waitPending(t, w)
			clk.Advance(w - time.Millisecond)
			time.Sleep(5 * time.Millisecond)
			require.Equal(t, int32(i+1), attempts.Load(), "no attempt before the %v wait is over", w)
			clk.Advance(time.Millisecond)
		}
		waitFor(t, 5*time.Second, "last attempt", func() bool { return attempts.Load() == int32(len(want)+1) })
	})

	t.Run("jitter stays within ±20%", func(t *testing.T) {
		clk := newFakeClock()
		_, attempts := failingClient(t, clk)
		for i, w := range want {
			waitFor(t, 5*time.Second, "attempt", func() bool { return attempts.Load() == int32(i+1) })
			d := clk.waitAnyPending(t)
			assert.GreaterOrEqual(t, d, time.Duration(float64(w)*0.8), "wait %d", i)
			assert.Less(t, d, time.Duration(float64(w)*1.2), "wait %d", i)
			clk.Advance(d)
		}
	})

	t.Run("custom schedule and injected randomness", func(t *testing.T) {
		clk := newFakeClock()
		fixedRand := func(o *options) { o.rand = func() float64 { return 0.75 } } // u = +0.5
		_, attempts := failingClient(t, clk, WithBackoff(100*time.Millisecond, 350*time.Millisecond), WithJitter(0.5), fixedRand)
		ms := time.Millisecond
		// base 100, 200, 350 (capped), 350, each ×1.25
		for i, w := range []time.Duration{125 * ms, 250 * ms, 437500 * time.Microsecond, 437500 * time.Microsecond} {
			waitFor(t, 5*time.Second, "attempt", func() bool { return attempts.Load() == int32(i+1) })
			clk.waitPending(t, w)
			clk.Advance(w)
		}
	})
}

// TestCloseDuringBackoff: Close must not wait for a 60 s backoff.
func TestCloseDuringBackoff(t *testing.T) {
	clk := newFakeClock()
	c, attempts := failingClient(t, clk)
	waitFor(t, 5*time.Second, "first attempt", func() bool { return attempts.Load() == 1 })
	clk.waitAnyPending(t)
	done := make(chan struct{})
	go func() { _ = c.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close blocked on the backoff timer")
	}
	assert.ErrorIs(t, c.Call(context.Background(), "__ping", nil, nil), ErrClosed)
}

// TestReconnectPacing: a link that lived at least the initial backoff is
// replaced at once; one that died sooner costs a backoff wait.
func TestReconnectPacing(t *testing.T) {
	clk := newFakeClock()
	f := &fakeServer{}
	connector, links := pipeConnector(f)
	o := buildOptions([]Option{WithClock(clk), WithHeartbeat(0, 0, 1), WithJitter(0), WithLogger(testLogger())})
	o.connector = connector
	c, err := start(context.Background(), o)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()); f.wg.Wait() }()

	// Stable link (lived 3 s): immediate replacement, no timer.
	clk.Advance(3 * time.Second)
	c.mu.Lock()
	c.cur.kill(errors.New("test: link dropped"))
	c.mu.Unlock()
	waitFor(t, 5*time.Second, "immediate reconnect", func() bool { return links.Load() == 2 && c.Status().Connected })
	assert.Equal(t, 0, clk.pendingCount(), "no backoff timer after a stable link")

	// Short-lived link (1 s): one 3 s backoff first.
	clk.Advance(time.Second)
	c.mu.Lock()
	c.cur.kill(errors.New("test: link dropped again"))
	c.mu.Unlock()
	clk.waitPending(t, 3*time.Second)
	assert.Equal(t, int32(2), links.Load())
	clk.Advance(3 * time.Second)
	waitFor(t, 5*time.Second, "reconnect after backoff", func() bool { return links.Load() == 3 && c.Status().Connected })
	assert.Equal(t, 3, c.Status().Connects)
}
