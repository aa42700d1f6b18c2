//go:build unix

package reconnect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// These tests run the real boxrt binary (built in TestMain). The ones that
// need sandboxes skip when boxrt reports no usable backend.

// requireBackend skips unless the runtime behind c has a working backend.
func requireBackend(t *testing.T, c Caller) {
	t.Helper()
	var info struct {
		Name      string `json:"name"`
		Available bool   `json:"available"`
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// box_health, not box_get_backend_info: the latter starts measuring
	// the backend's isolation in a probe sandbox, which a child killed -9
	// mid-way would leave behind.
	require.NoError(t, c.Call(ctx, "box_health", struct{}{}, &info))
	if !info.Available {
		t.Fatalf("boxrt has no usable backend here (%+v): run scripts/setup", info)
	}
	t.Logf("backend: %s", info.Name)
}

// logTail shows the runtime's stderr when a test fails.
func logTail(t *testing.T, buf *syncBuffer) {
	t.Cleanup(func() {
		if t.Failed() {
			s := buf.String()
			if len(s) > 6000 {
				s = s[len(s)-6000:]
			}
			t.Logf("boxrt stderr (tail):\n%s", s)
		}
	})
}

// kill -9 of the spawned child during an in-flight box_exec: the call fails
// at once with a retryable error, the child is respawned, OnConnect runs
// again and the next calls succeed.
func TestRealKillChildDuringExec(t *testing.T) {
	needRealBinary(t)
	state := t.TempDir()
	stderr := &syncBuffer{}
	logTail(t, stderr)
	var onConnect atomic.Int32
	states := &stateLog{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Spawn(ctx,
		WithCommand(realBin, "serve", "--stdio", "--listen", "127.0.0.1:0", "--state-dir", state),
		WithEnv(realEnv()),
		WithStderr(stderr),
		WithLogger(testLogger()),
		WithOnStateChange(states.hook),
		WithOnConnect(func(ctx context.Context, c Caller) error {
			onConnect.Add(1)
			return c.Call(ctx, "box_init", map[string]any{}, nil)
		}))
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	requireBackend(t, c)
	pid1 := c.Status().PID

	// Create the session first so the exec below is running, not
	// starting a container, when the child dies.
	require.NoError(t, c.Call(ctx, "box_create_session", map[string]any{"session_id": "k1"}, nil))
	errc := make(chan error, 1)
	go func() {
		errc <- c.Call(ctx, "box_exec", map[string]any{"session_id": "k1", "cmd": "sleep 30", "timeout_sec": 60}, nil)
	}()
	time.Sleep(time.Second)
	select {
	case err := <-errc:
		t.Fatalf("box_exec sleep 30 returned early: %v", err)
	default:
	}

	killed := time.Now()
	require.NoError(t, syscall.Kill(pid1, syscall.SIGKILL))
	select {
	case err := <-errc:
		failedAfter := time.Since(killed)
		t.Logf("in-flight box_exec failed %v after SIGKILL: %v", failedAfter, err)
		var e *Error
		require.ErrorAs(t, err, &e)
		assert.ErrorIs(t, err, ErrRuntimeUnavailable)
		assert.True(t, e.Retryable)
		assert.Less(t, failedAfter, time.Second, "the call fails at once, not at its timeout")
	case <-time.After(10 * time.Second):
		t.Fatal("the in-flight box_exec did not fail after the child was killed")
	}

	require.NoError(t, c.Call(ctx, "__ping", struct{}{}, nil))
	t.Logf("first __ping after respawn succeeded %v after SIGKILL", time.Since(killed))
	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	require.NoError(t, c.Call(ctx, "box_exec", map[string]any{"session_id": "k1", "cmd": "echo back", "timeout_sec": 60}, &res))
	assert.Equal(t, 0, res.ExitCode)
	assert.Equal(t, "back\n", res.Stdout)

	st := c.Status()
	assert.NotEqual(t, pid1, st.PID, "a new child")
	assert.Equal(t, 2, st.Connects)
	assert.Equal(t, int32(2), onConnect.Load(), "OnConnect ran again on the new child")
	assert.True(t, processGone(pid1), "the killed child was reaped")
	assert.Equal(t, 1, states.count(StateDisconnected), states.String())
	_ = c.Call(ctx, "box_delete_session", map[string]any{"session_id": "k1"}, nil)
}

// stallProxy forwards TCP between a client and boxrt and can stop
// forwarding without closing anything, like a wedged NAT or a paused VM.
type stallProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func newStallProxy(t *testing.T, upstream string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		if !p.track(down, up) {
			return
		}
		p.wg.Add(2)
		go p.pipe(down, up)
		go p.pipe(up, down)
	}
}

func (p *stallProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, holding data while stalled.
func (p *stallProxy) pipe(src, dst net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed {
				p.cond.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) setStalled(v bool) {
	p.mu.Lock()
	p.stalled = v
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *stallProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// startServe runs `boxrt serve --listen ADDR` and waits for its listener.
// It returns the address and the control token boxrt generated in state.
func startServe(t *testing.T, state string, stderr io.Writer) (string, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	cmd := exec.Command(realBin, "serve", "--listen", addr, "--state-dir", state)
	cmd.Stderr = stderr
	cmd.Env = realEnv()
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	waitFor(t, 15*time.Second, "boxrt to listen", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	token, err := os.ReadFile(filepath.Join(state, "control-token"))
	require.NoError(t, err, "boxrt keeps its generated control token in the state directory")
	return addr, strings.TrimSpace(string(token))
}

// A proxy that silently stops forwarding: the heartbeat declares the link
// dead within interval × failures (+ the last ping's timeout and slack),
// the client reconnects once the proxy heals, and a session created before
// the stall is still there.
func TestRealProxyStall(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	addr, token := startServe(t, t.TempDir(), stderr)
	proxy := newStallProxy(t, addr)

	interval, timeout, failures := 300*time.Millisecond, 200*time.Millisecond, 3
	states := &stateLog{}
	var onConnect atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Dial(ctx, "http://"+proxy.addr(),
		WithToken(token),
		WithHeartbeat(interval, timeout, failures),
		WithBackoff(200*time.Millisecond, time.Second),
		WithConnectTimeout(time.Second),
		WithLogger(testLogger()),
		WithOnStateChange(states.hook),
		WithOnConnect(func(ctx context.Context, c Caller) error {
			onConnect.Add(1)
			return c.Call(ctx, "box_init", map[string]any{}, nil)
		}))
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()

	withSession := true
	var info struct{ Available bool }
	require.NoError(t, c.Call(ctx, "box_health", struct{}{}, &info))
	if !info.Available {
		withSession = false
		t.Log("no usable backend: checking the stall and recovery with __ping only")
	}
	if withSession {
		require.NoError(t, c.Call(ctx, "box_create_session", map[string]any{"session_id": "stall1"}, nil))
		defer func() {
			_ = c.Call(context.Background(), "box_delete_session", map[string]any{"session_id": "stall1"}, nil)
		}()
	}

	stalledAt := time.Now()
	proxy.setStalled(true)
	waitFor(t, 10*time.Second, "the link to be declared dead", func() bool { return states.count(StateDisconnected) == 1 })
	ev, _ := states.first(StateDisconnected)
	took := ev.at.Sub(stalledAt)
	bound := time.Duration(failures)*interval + timeout
	t.Logf("stalled link declared dead after %v (interval × failures + timeout = %v): %v", took, bound, ev.err)
	assert.Less(t, took, bound+time.Second)
	assert.ErrorContains(t, ev.err, "consecutive __ping failures")

	// While the proxy stays stalled, calls wait and then give up.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	err = c.Call(short, "__ping", struct{}{}, nil)
	cancelShort()
	assert.ErrorIs(t, err, ErrRuntimeUnavailable)

	healedAt := time.Now()
	proxy.setStalled(false)
	require.NoError(t, c.Call(ctx, "__ping", struct{}{}, nil))
	t.Logf("first call after healing succeeded after %v", time.Since(healedAt))
	assert.Equal(t, int32(2), onConnect.Load())
	assert.Equal(t, 2, c.Status().Connects)

	if withSession {
		var s struct {
			SessionID string `json:"session_id"`
		}
		require.NoError(t, c.Call(ctx, "box_get_session", map[string]any{"session_id": "stall1"}, &s),
			"the session outlives the control connection")
		assert.Equal(t, "stall1", s.SessionID)
	}
}

// After Close nothing of the client is left: goroutines, child, sockets.
func TestRealNoLeakAfterClose(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	addr, token := startServe(t, t.TempDir(), stderr)
	before := goleak.IgnoreCurrent()

	spawned, err := Spawn(ctx, WithCommand(realBin, "serve", "--stdio", "--listen", "", "--state-dir", t.TempDir()), WithEnv(realEnv()),
		WithStderr(stderr), WithHeartbeat(50*time.Millisecond, 50*time.Millisecond, 3))
	require.NoError(t, err)
	dialed, err := Dial(ctx, "ws://"+addr, WithToken(token), WithHeartbeat(50*time.Millisecond, 50*time.Millisecond, 3))
	require.NoError(t, err)

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(2)
		for _, c := range []*Client{spawned, dialed} {
			go func() {
				defer wg.Done()
				var got string
				assert.NoError(t, c.Call(ctx, "__ping", struct{}{}, nil))
				// Unknown methods come back typed and leave the link up.
				err := c.Call(ctx, fmt.Sprintf("no_such_method_%d", i), nil, &got)
				assert.ErrorIs(t, err, ErrMethodNotFound)
			}()
		}
	}
	wg.Wait()
	time.Sleep(150 * time.Millisecond) // a few heartbeats
	pid := spawned.Status().PID

	require.NoError(t, spawned.Close())
	require.NoError(t, dialed.Close())
	assert.True(t, processGone(pid), "the child was reaped")
	goleak.VerifyNone(t, before)
	assert.True(t, errors.Is(spawned.Call(ctx, "__ping", nil, nil), ErrClosed))
	assert.False(t, strings.Contains(stderr.String(), "panic"))
}

// A runtime that cannot start ends Spawn at once, not after retrying
// until the context does: an unknown flag, and a state directory another
// runtime holds.
func TestRealSpawnStartErrorFailsFast(t *testing.T) {
	needRealBinary(t)
	stderr := &syncBuffer{}
	logTail(t, stderr)
	held := t.TempDir()
	startServe(t, held, stderr)
	for _, tc := range []struct {
		name string
		opts []Option
		want string
	}{
		{"unknown flag", []Option{WithCommand(realBin, "serve", "--stdio", "--no-such-flag")}, "flag provided but not defined: -no-such-flag"},
		{"state directory held", []Option{WithCommand(realBin, "serve", "--stdio", "--listen", ""), WithStateDir(held)}, "is in use by"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			_, err := Spawn(ctx, append(tc.opts, WithEnv(realEnv()), WithStderr(stderr))...)
			took := time.Since(start)
			t.Logf("Spawn failed after %v: %v", took, err)
			require.Error(t, err)
			assert.Less(t, took, 10*time.Second)
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.False(t, e.Retryable)
			assert.NotErrorIs(t, err, context.DeadlineExceeded)
			assert.ErrorContains(t, err, tc.want, "the child's stderr tail")
		})
	}
}
