//go:build unix

package reconnect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestNormalizeURL(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "ws://127.0.0.1:5410", want: "ws://127.0.0.1:5410/rpc/ws"},
		{in: "ws://127.0.0.1:5410/", want: "ws://127.0.0.1:5410/rpc/ws"},
		{in: "http://127.0.0.1:5410", want: "ws://127.0.0.1:5410/rpc/ws"},
		{in: "https://box.example:443", want: "wss://box.example:443/rpc/ws"},
		{in: "wss://box.example/custom/rpc", want: "wss://box.example/custom/rpc"},
		{in: "HTTP://Box:5410/rpc/ws", want: "ws://Box:5410/rpc/ws"},
		{in: "127.0.0.1:5410", want: "ws://127.0.0.1:5410/rpc/ws"},
		{in: "  ws://h:1/rpc/ws#frag ", want: "ws://h:1/rpc/ws"},
		{in: "", err: "empty"},
		{in: "ftp://h:1", err: "scheme"},
		{in: "ws://", err: "no host"},
		{in: "ws://user:secret@h:1", err: "credentials"},
		{in: "ws://h:1/rpc/ws?token=abc", err: "token"},
		{in: "ws://h:1/rpc/ws?access_token=abc", err: "token"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := normalizeURL(tt.in)
			if tt.err != "" {
				require.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func dialFake(t *testing.T, f *fakeWS, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, f.URL, append([]Option{WithToken(f.token), WithLogger(testLogger())}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func TestDialCallsAndErrors(t *testing.T) {
	f := newFakeWS(t, "s3cret-token")
	c := dialFake(t, f)

	var out map[string]any
	require.NoError(t, c.Call(context.Background(), "echo", map[string]any{"a": 1, "s": "x"}, &out))
	assert.Equal(t, map[string]any{"a": float64(1), "s": "x"}, out)

	var raw json.RawMessage
	require.NoError(t, c.Call(context.Background(), "__ping", struct{}{}, &raw))
	assert.JSONEq(t, `{}`, string(raw))

	// Every code of the table comes back typed, over the real wire.
	for _, k := range boxerr.Kinds {
		t.Run(k.Type, func(t *testing.T) {
			we := boxErr(k.Code, k.Type, "details here", k.Retryable)
			err := c.Call(context.Background(), "fail", we, nil)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.ErrorIs(t, err, k)
			assert.Equal(t, k.Code, e.Code)
			assert.Equal(t, k.Type, e.Type)
			assert.Equal(t, k.Type+": details here", e.Message)
			assert.Equal(t, k.Retryable, e.Retryable)
		})
	}

	err := c.Call(context.Background(), "no_such_method", nil, nil)
	assert.ErrorIs(t, err, ErrMethodNotFound)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.JSONEq(t, `{"type":"MethodNotFound","retryable":false,"method":"no_such_method"}`, string(e.Data))

	// A result that does not fit is a decoding error, not an *Error.
	var n int
	err = c.Call(context.Background(), "echo", "text", &n)
	require.Error(t, err)
	assert.False(t, errors.As(err, &e))

	// The token went in the header only.
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, q := range f.queries {
		assert.Empty(t, q, "handshake %d had a query string", i)
		assert.Equal(t, "Bearer s3cret-token", f.headers[i].Get("Authorization"))
	}
}

func TestDialWrongTokenFailsFast(t *testing.T) {
	f := newFakeWS(t, "right-token")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, f.URL, WithToken("wrong-token"))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 2*time.Second, "a refused token is not retried")
	assert.ErrorContains(t, err, "HTTP 401")
	assert.NotContains(t, err.Error(), "wrong-token", "the token never appears in errors")
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.ErrorIs(t, err, ErrRuntimeUnavailable)
	assert.False(t, e.Retryable, "the same token will be refused again")
}

func TestDialContextEndsBeforeRuntimeIsUp(t *testing.T) {
	f := newFakeWS(t, "")
	f.setRefusing(true)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := Dial(ctx, f.URL, WithBackoff(20*time.Millisecond, 50*time.Millisecond))
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrRuntimeUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "HTTP 503", "the last attempt's failure is reported")
}

// Calls made while the link is down wait for it, or fail when their
// context ends; the OnConnect hook runs on the new link before any of them.
func TestQueuedCallsWaitForOnConnect(t *testing.T) {
	f := newFakeWS(t, "")
	var hookRuns atomic.Int32
	hook := func(ctx context.Context, c Caller) error {
		hookRuns.Add(1)
		return c.Call(ctx, "box_init", map[string]any{"backend": "auto"}, nil)
	}
	states := &stateLog{}
	c := dialFake(t, f, WithOnConnect(hook), WithBackoff(50*time.Millisecond, 100*time.Millisecond), WithOnStateChange(states.hook))
	require.Equal(t, int32(1), f.inits.Load())

	// Runtime goes away: refuse handshakes, drop the socket.
	f.setRefusing(true)
	f.dropAll()
	waitFor(t, 5*time.Second, "disconnect", func() bool { return states.count(StateDisconnected) == 1 })

	// A call with a short deadline gives up with a retryable error.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	start := time.Now()
	err := c.Call(ctx, "echo", 1, nil)
	cancel()
	assert.ErrorIs(t, err, ErrRuntimeUnavailable)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.True(t, e.Retryable)
	assert.Less(t, time.Since(start), 5*time.Second, "gives up at its deadline, not later")

	// Queue calls, hold box_init on the new link, then let it through.
	gate := make(chan struct{})
	f.mu.Lock()
	f.gate = gate
	f.mu.Unlock()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got int
			err := c.Call(context.Background(), "echo", i, &got)
			if err == nil && got != i {
				err = errors.New("wrong echo")
			}
			errs <- err
		}()
	}
	before := len(f.arrived())
	f.setRefusing(false)
	waitFor(t, 5*time.Second, "box_init on the new link", func() bool {
		a := f.arrived()
		return len(a) > before && a[len(a)-1] == "box_init"
	})
	time.Sleep(50 * time.Millisecond)
	for _, m := range f.arrived()[before:] {
		assert.NotEqual(t, "echo", m, "a queued call overtook OnConnect")
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.Equal(t, int32(2), hookRuns.Load())
	assert.Equal(t, int32(2), f.inits.Load())
	a := f.arrived()[before:]
	assert.Equal(t, []string{"__ping", "box_init"}, a[:2], "handshake order on the new link")
}

func TestCallInFlightContextDeadline(t *testing.T) {
	f := newFakeWS(t, "")
	c := dialFake(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := c.Call(ctx, "hang", nil, nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, ErrRuntimeUnavailable, "the runtime was reachable, just slow")
	require.NoError(t, c.Call(context.Background(), "__ping", nil, nil), "the link survives a timed-out call")
	assert.Equal(t, 1, c.Status().Connects)
}

// Real-time heartbeat over WebSocket: a stalled runtime is declared dead
// within interval × failures + timeout, and the link comes back.
func TestHeartbeatStallRealTime(t *testing.T) {
	f := newFakeWS(t, "")
	states := &stateLog{}
	interval, timeout := 100*time.Millisecond, 80*time.Millisecond
	c := dialFake(t, f, WithHeartbeat(interval, timeout, 3), WithBackoff(50*time.Millisecond, 100*time.Millisecond),
		WithConnectTimeout(300*time.Millisecond), WithOnStateChange(states.hook))
	stalledAt := time.Now()
	f.stalled.Store(true)
	waitFor(t, 5*time.Second, "disconnect", func() bool { return states.count(StateDisconnected) == 1 })
	e, _ := states.first(StateDisconnected)
	took := e.at.Sub(stalledAt)
	t.Logf("stall declared dead after %v (bound %v)", took, 3*interval+timeout)
	assert.Less(t, took, 3*interval+timeout+time.Second, "slack for a loaded machine")
	assert.GreaterOrEqual(t, took, 2*interval+timeout, "not before the third miss")
	f.stalled.Store(false)
	require.NoError(t, c.Call(context.Background(), "__ping", nil, nil))
	assert.Equal(t, 2, c.Status().Connects)
}

func spawnFake(t *testing.T, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Spawn(ctx, append(append(fakeChildCommand(), WithLogger(testLogger())), opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

func TestSpawnKillChildDuringCall(t *testing.T) {
	var hookRuns atomic.Int32
	states := &stateLog{}
	c := spawnFake(t, WithOnConnect(func(ctx context.Context, c Caller) error {
		hookRuns.Add(1)
		return c.Call(ctx, "box_init", struct{}{}, nil)
	}), WithOnStateChange(states.hook), WithBackoff(200*time.Millisecond, time.Second))
	pid1 := c.Status().PID
	require.NotZero(t, pid1)

	errc := make(chan error, 1)
	go func() { errc <- c.Call(context.Background(), "hang", nil, nil) }()
	time.Sleep(100 * time.Millisecond) // let it reach the child
	killed := time.Now()
	require.NoError(t, syscall.Kill(pid1, syscall.SIGKILL))
	select {
	case err := <-errc:
		t.Logf("in-flight call failed %v after SIGKILL: %v", time.Since(killed), err)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.ErrorIs(t, err, ErrRuntimeUnavailable)
		assert.True(t, e.Retryable)
		assert.Contains(t, err.Error(), "killed")
		assert.Less(t, time.Since(killed), 4*time.Second, "fails on the child's death, not on a heartbeat")
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight call did not fail after the child was killed")
	}

	var pid2 int
	require.NoError(t, c.Call(context.Background(), "pid", nil, &pid2))
	assert.NotEqual(t, pid1, pid2)
	assert.Equal(t, int32(2), hookRuns.Load())
	assert.True(t, processGone(pid1), "the dead child was reaped")
	assert.Equal(t, 1, states.count(StateDisconnected))
}

func TestSpawnCloseStopsChild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Spawn(ctx, fakeChildCommand()...)
	require.NoError(t, err)
	pid := c.Status().PID
	errc := make(chan error, 1)
	go func() { errc <- c.Call(context.Background(), "hang", nil, nil) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, c.Close())
	assert.Less(t, time.Since(start), 2*time.Second, "stdin EOF ends the fake child")
	assert.True(t, processGone(pid))
	assert.ErrorIs(t, <-errc, ErrClosed, "in-flight calls end with ErrClosed")
	assert.ErrorIs(t, c.Call(context.Background(), "__ping", nil, nil), ErrClosed)
	require.NoError(t, c.Close(), "Close twice is fine")
}

func TestSpawnStderrAndBanner(t *testing.T) {
	var buf syncBuffer
	c := spawnFake(t, WithEnv(append(os.Environ(), fakeChildEnv+"=1", "GORACE=atexit_sleep_ms=0", "FAKE_CHILD_BANNER=1")), WithStderr(&buf))
	require.NoError(t, c.Call(context.Background(), "stderr", map[string]string{"text": "hello from the child"}, nil))
	waitFor(t, 5*time.Second, "stderr", func() bool { return strings.Contains(buf.String(), "hello from the child") })
	assert.Contains(t, buf.String(), "fake child ready")
}

func TestSpawnNotFoundFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Spawn(ctx, WithCommand("/nonexistent/boxrt", "serve", "--stdio"))
	require.Error(t, err)
	assert.Less(t, time.Since(start), 10*time.Second, "not retried until the context ends")
	assert.ErrorContains(t, err, "/nonexistent/boxrt")
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.False(t, e.Retryable)
}

// A child that exits with status 1 or 2 before answering (boxrt's
// start-up errors) fails Spawn at once, with its last words; another exit
// (a wrapper's own status) is retried until the context ends.
func TestSpawnChildExitsAtStart(t *testing.T) {
	for _, status := range []string{"1", "2"} {
		t.Run("status "+status, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			_, err := Spawn(ctx, fakeChildCommand("FAKE_CHILD_EXIT=boxrt: --listen: address already in use", "FAKE_CHILD_EXIT_STATUS="+status)...)
			require.Error(t, err)
			assert.Less(t, time.Since(start), 10*time.Second, "not retried until the context ends")
			assert.ErrorIs(t, err, ErrRuntimeUnavailable)
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.False(t, e.Retryable)
			assert.ErrorContains(t, err, "exit status "+status)
			assert.ErrorContains(t, err, "address already in use", "the child's last words are in the error")
		})
	}
	t.Run("status 255", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := Spawn(ctx, append(fakeChildCommand("FAKE_CHILD_EXIT=ssh: connect to host box: Connection refused", "FAKE_CHILD_EXIT_STATUS=255"),
			WithBackoff(20*time.Millisecond, 50*time.Millisecond))...)
		require.Error(t, err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.True(t, e.Retryable)
		assert.ErrorContains(t, err, "exit status 255")
		assert.ErrorContains(t, err, "Connection refused")
	})
}

func TestOnConnectNonRetryableFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Spawn(ctx, append(fakeChildCommand("FAKE_CHILD_INIT_FAILS=1"), WithOnConnect(func(ctx context.Context, c Caller) error {
		return c.Call(ctx, "box_init", map[string]any{"limits": map[string]int{"max_sessions": -1}}, nil)
	}))...)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrValidation, "the hook's error stays reachable")
	assert.ErrorIs(t, err, ErrRuntimeUnavailable)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.False(t, e.Retryable)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// A child that stops reading stdin must not hold a call past its context.
func TestWriteHonoursContext(t *testing.T) {
	c := spawnFake(t, WithHeartbeat(0, 0, 1))
	require.NoError(t, c.Call(context.Background(), "stop_reading", nil, nil))
	big := strings.Repeat("x", 4<<20) // far beyond a pipe buffer
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Call(ctx, "echo", big, nil)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second, "a blocked write gives up at the deadline")
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A call blocked writing to a child that stopped reading must not keep the
// heartbeat from declaring the link dead: the ping times out waiting for
// its turn, the link is replaced, and the blocked call fails retryably.
func TestHeartbeatBehindWedgedWrite(t *testing.T) {
	states := &stateLog{}
	c := spawnFake(t, WithHeartbeat(100*time.Millisecond, 100*time.Millisecond, 2),
		WithBackoff(50*time.Millisecond, 100*time.Millisecond), WithOnStateChange(states.hook))
	pid := c.Status().PID
	require.NoError(t, c.Call(context.Background(), "stop_reading", nil, nil))
	errc := make(chan error, 1)
	go func() { errc <- c.Call(context.Background(), "echo", strings.Repeat("x", 4<<20), nil) }()
	select {
	case err := <-errc:
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.True(t, e.Retryable)
		assert.ErrorIs(t, err, ErrRuntimeUnavailable)
	case <-time.After(10 * time.Second):
		t.Fatal("a write to a wedged child was never cut off")
	}
	require.NoError(t, c.Call(context.Background(), "__ping", nil, nil))
	assert.NotEqual(t, pid, c.Status().PID)
	e, _ := states.first(StateDisconnected)
	assert.ErrorContains(t, e.err, "consecutive __ping failures")
}
