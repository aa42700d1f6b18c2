package runtime

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
)

// collectSink gathers chunks; delay slows it down.
type collectSink struct {
	mu     sync.Mutex
	chunks []ExecChunk
	delay  time.Duration
}

func (c *collectSink) sink(ch ExecChunk) error {
	if c.delay > 0 {
		time.Sleep(c.delay)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.chunks = append(c.chunks, ch)
	return nil
}

func (c *collectSink) got() []ExecChunk {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ExecChunk(nil), c.chunks...)
}

func TestChunkerCoalesces(t *testing.T) {
	euro := "\u20ac" // 3 bytes
	cases := []struct {
		name   string
		writes []string
		sizes  []int // chunk sizes expected
	}{
		{name: "small writes become one chunk", writes: []string{"a", "b", "c", "d"}, sizes: []int{4}},
		{name: "large write is cut at ExecChunkBytes", writes: []string{strings.Repeat("x", 2*ExecChunkBytes+100)}, sizes: []int{ExecChunkBytes, ExecChunkBytes, 100}},
		{name: "a character is never split", writes: []string{strings.Repeat("x", ExecChunkBytes-1) + euro + "y"}, sizes: []int{ExecChunkBytes - 1, 4}},
		{name: "a character split across writes", writes: []string{strings.Repeat("x", ExecChunkBytes-1) + euro[:1], euro[1:] + "y"}, sizes: []int{ExecChunkBytes - 1, 4}},
		{name: "writes that grow the buffer", writes: slices.Repeat([]string{strings.Repeat("y", 30000)}, 5), sizes: []int{ExecChunkBytes, ExecChunkBytes, 150000 - 2*ExecChunkBytes}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := newExecOutput("x-test", ExecReplayBytes, nil)
			c := &chunker{out: out, stream: StreamStdout}
			var want bytes.Buffer
			for _, w := range tc.writes {
				_, err := c.Write([]byte(w))
				require.NoError(t, err)
				want.WriteString(w)
			}
			c.close()
			out.close()
			var sizes []int
			var got bytes.Buffer
			for _, ch := range out.chunks {
				sizes = append(sizes, len(ch.Data))
				assert.Equal(t, int64(got.Len()), ch.Offset)
				got.Write(ch.Data)
			}
			assert.Equal(t, tc.sizes, sizes)
			assert.Equal(t, want.String(), got.String())
		})
	}
}

func TestChunkerFlushesAfterDelay(t *testing.T) {
	out := newExecOutput("x-test", ExecReplayBytes, nil)
	c := &chunker{out: out, stream: StreamStderr}
	_, _ = c.Write([]byte("quiet"))
	require.Eventually(t, func() bool {
		out.mu.Lock()
		defer out.mu.Unlock()
		return len(out.chunks) == 1
	}, time.Second, time.Millisecond, "a lone write goes out without more output")
	assert.Equal(t, "quiet", string(out.chunks[0].Data))
	assert.Equal(t, StreamStderr, out.chunks[0].Stream)
	c.close()
}

func TestExecOutputReplay(t *testing.T) {
	const chunk = 1000
	cases := []struct {
		name          string
		chunks        int
		max           int
		from          int64
		droppedChunks int64
		droppedBytes  int64
		replayed      int
	}{
		{name: "everything kept", chunks: 5, max: 10 * chunk, from: 0, replayed: 5},
		{name: "over the bound from the start", chunks: 10, max: 4 * chunk, from: 0, droppedChunks: 6, droppedBytes: 6 * chunk, replayed: 4},
		{name: "from a kept seq", chunks: 10, max: 4 * chunk, from: 8, replayed: 2},
		{name: "from a dropped seq", chunks: 10, max: 4 * chunk, from: 3, droppedChunks: 3, droppedBytes: 6 * chunk, replayed: 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := newExecOutput("x-test", tc.max, nil)
			for i := 0; i < tc.chunks; i++ {
				out.append(StreamStdout, bytes.Repeat([]byte{byte('a' + i)}, chunk))
			}
			out.close()
			sub, rep := out.subscribe(tc.from)
			assert.Equal(t, tc.droppedChunks, rep.DroppedChunks)
			assert.Equal(t, tc.droppedBytes, rep.DroppedBytes)
			var c collectSink
			out.follow(sub, c.sink, nil)
			got := c.got()
			require.Len(t, got, tc.replayed+1)
			assert.True(t, got[len(got)-1].EOF, "the last chunk marks the end")
			for i := 1; i < len(got); i++ {
				assert.Equal(t, got[i-1].Seq+1, got[i].Seq)
			}
		})
	}
}

// TestExecOutputBackpressure: a slow subscriber gets every chunk; the
// producer waits for it rather than dropping.
func TestExecOutputBackpressure(t *testing.T) {
	out := newExecOutput("x-test", 3*ExecChunkBytes, nil)
	sub, _ := out.subscribe(0)
	c := collectSink{delay: time.Millisecond}
	done := make(chan struct{})
	go func() {
		defer close(done)
		out.follow(sub, c.sink, nil)
	}()
	const n = 50
	for i := 0; i < n; i++ {
		out.append(StreamStdout, bytes.Repeat([]byte{'z'}, ExecChunkBytes))
		out.mu.Lock()
		assert.LessOrEqual(t, out.bytes, 4*ExecChunkBytes, "the buffer stays bounded")
		out.mu.Unlock()
	}
	out.close()
	<-done
	got := c.got()
	require.Len(t, got, n+1)
	for i, ch := range got[:n] {
		assert.Equal(t, int64(i), ch.Seq)
	}
}

// blockingExec is a fake exec that prints, then runs until its context
// ends (status canceled) or its stdin closes (exit 0, stdin echoed).
func blockingExec(ctx context.Context, _ backends.Session, req backends.ExecRequest) (backends.ExitStatus, error) {
	_, _ = io.WriteString(req.Stdout, "started\n")
	if req.Stdin != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.Copy(req.Stdout, req.Stdin)
		}()
		select {
		case <-done:
			return backends.ExitStatus{}, nil
		case <-ctx.Done():
			req.Stdin.Close()
			<-done
			return backends.ExitStatus{}, ctx.Err()
		}
	}
	for {
		select {
		case <-ctx.Done():
			return backends.ExitStatus{}, ctx.Err()
		case sig := <-req.Signals:
			if sig == syscall.SIGTERM {
				return backends.ExitStatus{ExitCode: 143}, nil
			}
		}
	}
}

func TestBackgroundExecLifecycle(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	fb.execFn = blockingExec
	rt, clock := newTestRuntime(t, fb, `{"limits":{"session_ttl_sec":60}}`)

	s := spec("bg")
	s.Cmd = "serve"
	info, err := rt.Execs().Start(ctx, s, ExecOptions{})
	require.NoError(t, err)
	assert.Equal(t, StatusRunning, info.Status)

	clock.Advance(10 * time.Minute)
	assert.Equal(t, 0, rt.Reap(ctx), "a session with a running background exec is not reaped")

	res, err := rt.Execs().Wait(ctx, info.ExecID, 10*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, StatusRunning, res.Status)
	assert.Equal(t, "started\n", res.Stdout)

	cases := []struct {
		name   string
		sig    syscall.Signal
		status string
	}{
		{name: "KILL cancels", sig: syscall.SIGKILL, status: StatusCanceled},
		{name: "TERM lets it end", sig: syscall.SIGTERM, status: StatusCompleted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x, err := rt.Execs().Start(ctx, s, ExecOptions{})
			require.NoError(t, err)
			killed, err := rt.Execs().Kill(ctx, x.ExecID, tc.sig)
			require.NoError(t, err)
			assert.Equal(t, tc.status, killed.Status)
			res, err := rt.Execs().Wait(ctx, x.ExecID, 0)
			require.NoError(t, err)
			assert.Equal(t, tc.status, res.Status)
		})
	}

	_, err = rt.Execs().Kill(ctx, info.ExecID, 0)
	require.NoError(t, err)
	clock.Advance(2 * time.Minute)
	assert.Equal(t, 1, rt.Reap(ctx), "once the exec ended the session is idle")

	clock.Advance(10*time.Minute + time.Second)
	_, err = rt.Execs().Wait(ctx, info.ExecID, 0)
	assert.True(t, errors.Is(err, boxerr.ErrValidation), "a finished exec is forgotten after the retention: %v", err)
}

func TestBackgroundExecStdinAndDelete(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	fb.execFn = blockingExec
	rt, _ := newTestRuntime(t, fb, "")
	s := spec("stdin")
	s.Cmd = "cat"

	var sink collectSink
	x, err := rt.Execs().Start(ctx, s, ExecOptions{Stdin: true, Sink: sink.sink})
	require.NoError(t, err)
	require.NoError(t, rt.Execs().WriteStdin(context.Background(), x.ExecID, []byte("hello\n"), true))
	err = rt.Execs().WriteStdin(context.Background(), x.ExecID, []byte("more"), false)
	assert.True(t, errors.Is(err, boxerr.ErrValidation), "stdin is closed: %v", err)
	res, err := rt.Execs().Wait(ctx, x.ExecID, 0)
	require.NoError(t, err)
	assert.Equal(t, "started\nhello\n", res.Stdout)
	require.Eventually(t, func() bool {
		got := sink.got()
		return len(got) > 0 && got[len(got)-1].EOF
	}, 5*time.Second, time.Millisecond)
	var streamed string
	for _, c := range sink.got() {
		streamed += string(c.Data)
	}
	assert.Equal(t, "started\nhello\n", streamed)

	y, err := rt.Execs().Start(ctx, s, ExecOptions{})
	require.NoError(t, err)
	err = rt.Execs().WriteStdin(context.Background(), y.ExecID, []byte("x"), false)
	assert.True(t, errors.Is(err, boxerr.ErrValidation), "started without stdin: %v", err)
	require.NoError(t, rt.DeleteSession(ctx, "stdin"))
	_, err = rt.Execs().Wait(ctx, y.ExecID, 0)
	assert.True(t, errors.Is(err, boxerr.ErrSessionNotFound), "deletion kills the session's execs: %v", err)
}

func TestBackgroundExecLimit(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	fb.execFn = blockingExec
	rt, _ := newTestRuntime(t, fb, "")
	s := spec("many")
	s.Cmd = "serve"
	for i := 0; i < MaxBackgroundExecs; i++ {
		_, err := rt.Execs().Start(ctx, s, ExecOptions{})
		require.NoError(t, err)
	}
	_, err := rt.Execs().Start(ctx, s, ExecOptions{})
	var be *boxerr.Error
	require.True(t, errors.As(err, &be), "%v", err)
	assert.True(t, errors.Is(err, boxerr.ErrCapacityExceeded))
	assert.Equal(t, "max_background_execs", be.Details["limit"])
	execs, err := rt.Execs().List(context.Background(), "many")
	require.NoError(t, err)
	assert.Len(t, execs, MaxBackgroundExecs)
}

// TestForegroundCancel: a cancelled box_exec answers status canceled with
// the output so far, and the session stays.
func TestForegroundCancel(t *testing.T) {
	fb := newFake()
	fb.execFn = blockingExec
	rt, _ := newTestRuntime(t, fb, "")
	s := spec("fg")
	s.Cmd = "serve"
	var sink collectSink
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for len(sink.got()) == 0 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	res, err := rt.Execs().ExecWith(ctx, s, ExecOptions{Sink: sink.sink})
	require.NoError(t, err)
	assert.Equal(t, StatusCanceled, res.Status)
	assert.Nil(t, res.ExitCode)
	assert.Equal(t, "started\n", res.Stdout)
	got := sink.got()
	require.NotEmpty(t, got)
	assert.True(t, got[len(got)-1].EOF, "every chunk is out before the result")
	assert.Len(t, rt.ListSessions(context.Background()), 1)
}

// TestBackgroundExecLimitConcurrent: concurrent starts never overshoot the
// per-session limit.
func TestBackgroundExecLimitConcurrent(t *testing.T) {
	ctx := context.Background()
	fb := newFake()
	fb.execFn = blockingExec
	rt, _ := newTestRuntime(t, fb, "")
	s := spec("race")
	s.Cmd = "serve"
	_, err := rt.EnsureSession(ctx, s)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	started, refused := 0, 0
	for i := 0; i < 2*MaxBackgroundExecs; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := rt.Execs().Start(ctx, s, ExecOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				started++
			} else if errors.Is(err, boxerr.ErrCapacityExceeded) {
				refused++
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, MaxBackgroundExecs, started)
	assert.Equal(t, MaxBackgroundExecs, refused)
}
