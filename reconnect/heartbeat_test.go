package reconnect

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// heartbeatClient connects a Client over net.Pipe to f, on a fake clock,
// with the default heartbeat (20 s, 15 s, 3).
func heartbeatClient(t *testing.T, f *fakeServer, opts ...Option) (*Client, *fakeClock, *atomic.Int32, *stateLog) {
	t.Helper()
	clk := newFakeClock()
	states := &stateLog{}
	connector, links := pipeConnector(f)
	o := buildOptions(append([]Option{WithClock(clk), WithJitter(0), WithLogger(testLogger()), WithOnStateChange(states.hook)}, opts...))
	o.connector = connector
	c, err := start(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(func() {
		f.stalled.Store(false)
		require.NoError(t, c.Close())
		f.wg.Wait()
	})
	return c, clk, links, states
}

// missPing lets the heartbeat send one ping that f leaves unanswered, and
// times it out. With last, f answers again from then on (the dropped ping
// stays dropped), so the replacement link's handshake goes through.
func missPing(t *testing.T, clk *fakeClock, f *fakeServer, wait time.Duration, last ...bool) {
	t.Helper()
	before := f.arrived()
	clk.waitPending(t, wait)
	clk.Advance(wait)
	waitFor(t, 5*time.Second, "the ping to arrive", func() bool { return len(f.arrived()) > len(before) })
	clk.waitPending(t, DefaultHeartbeatTimeout)
	if len(last) > 0 && last[0] {
		f.stalled.Store(false)
	}
	clk.Advance(DefaultHeartbeatTimeout)
}

func TestHeartbeatDeclaresDeathAfterThreshold(t *testing.T) {
	tests := []struct {
		name      string
		threshold int
	}{
		{"default threshold 3", DefaultHeartbeatFailures},
		{"threshold 1", 1},
		{"threshold 5", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeServer{}
			c, clk, links, states := heartbeatClient(t, f, WithHeartbeat(DefaultHeartbeatInterval, DefaultHeartbeatTimeout, tt.threshold))
			start := clk.Now()
			f.stalled.Store(true)
			wait := DefaultHeartbeatInterval
			for i := 1; i <= tt.threshold; i++ {
				missPing(t, clk, f, wait, i == tt.threshold)
				// Pings are paced from the previous ping's start.
				wait = DefaultHeartbeatInterval - DefaultHeartbeatTimeout
				if i < tt.threshold {
					clk.waitPending(t, wait) // heartbeat is waiting again...
					assert.Equal(t, int32(1), links.Load(), "...and the link was kept after %d misses", i)
					assert.True(t, c.Status().Connected)
				}
			}
			waitFor(t, 5*time.Second, "the replacement link", func() bool { return links.Load() == 2 && c.Status().Connected })
			e, ok := states.first(StateDisconnected)
			require.True(t, ok)
			assert.ErrorContains(t, e.err, "consecutive __ping failures")
			// Dead after threshold × interval + timeout of silence.
			assert.Equal(t, time.Duration(tt.threshold)*DefaultHeartbeatInterval+DefaultHeartbeatTimeout, clk.Now().Sub(start))
			assert.Equal(t, 2, c.Status().Connects)
		})
	}
}

func TestHeartbeatSuccessResetsCount(t *testing.T) {
	f := &fakeServer{}
	c, clk, links, _ := heartbeatClient(t, f)
	f.stalled.Store(true)
	missPing(t, clk, f, DefaultHeartbeatInterval)
	missPing(t, clk, f, DefaultHeartbeatInterval-DefaultHeartbeatTimeout)
	f.stalled.Store(false)
	pings := f.pings.Load()
	clk.waitPending(t, DefaultHeartbeatInterval-DefaultHeartbeatTimeout)
	clk.Advance(DefaultHeartbeatInterval - DefaultHeartbeatTimeout)
	waitFor(t, 5*time.Second, "an answered ping", func() bool { return f.pings.Load() == pings+1 })
	f.stalled.Store(true)
	clk.waitPending(t, DefaultHeartbeatInterval)
	missPing(t, clk, f, DefaultHeartbeatInterval)
	missPing(t, clk, f, DefaultHeartbeatInterval-DefaultHeartbeatTimeout)
	clk.waitPending(t, DefaultHeartbeatInterval-DefaultHeartbeatTimeout)
	assert.Equal(t, int32(1), links.Load(), "2 misses, 1 answer, 2 misses: never 3 in a row")
	assert.True(t, c.Status().Connected)
}

// An error answer proves the link alive: a busy runtime is not a dead one.
func TestHeartbeatErrorAnswerIsAlive(t *testing.T) {
	f := &fakeServer{}
	f.pingErrors.Store(false)
	c, clk, links, _ := heartbeatClient(t, f)
	f.pingErrors.Store(true)
	for range 5 {
		pings := f.pings.Load()
		clk.waitPending(t, DefaultHeartbeatInterval)
		clk.Advance(DefaultHeartbeatInterval)
		waitFor(t, 5*time.Second, "a ping", func() bool { return f.pings.Load() == pings+1 })
	}
	clk.waitPending(t, DefaultHeartbeatInterval)
	assert.Equal(t, int32(1), links.Load())
	assert.True(t, c.Status().Connected)
}

// A call in flight on a link the heartbeat gives up on fails at once with a
// retryable error; the replacement serves the next call.
func TestHeartbeatDeathFailsInFlightCalls(t *testing.T) {
	f := &fakeServer{}
	c, clk, links, _ := heartbeatClient(t, f, WithHeartbeat(DefaultHeartbeatInterval, DefaultHeartbeatTimeout, 1))
	errc := make(chan error, 1)
	go func() { errc <- c.Call(context.Background(), "hang", nil, nil) }()
	waitFor(t, 5*time.Second, "hang to arrive", func() bool { return len(f.arrived()) == 2 })
	f.stalled.Store(true)
	missPing(t, clk, f, DefaultHeartbeatInterval, true)
	select {
	case err := <-errc:
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.ErrorIs(t, err, ErrRuntimeUnavailable)
		assert.True(t, e.Retryable)
		assert.ErrorContains(t, err, "consecutive __ping failures")
	case <-time.After(5 * time.Second):
		t.Fatal("the in-flight call did not fail when the link was declared dead")
	}
	require.NoError(t, c.Call(context.Background(), "__ping", nil, nil))
	assert.Equal(t, int32(2), links.Load())
}
