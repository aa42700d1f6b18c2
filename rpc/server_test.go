package rpc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/internal/boxerr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// blockingHandler answers "wait" only when released and everything else at
// once.
type blockingHandler struct {
	release chan struct{}
	mu      sync.Mutex
	notifs  int
}

func (h *blockingHandler) Handle(ctx context.Context, req *Request) (json.RawMessage, error) {
	if req.Notif {
		h.mu.Lock()
		h.notifs++
		h.mu.Unlock()
	}
	switch req.Method {
	case "wait":
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`"released"`), nil
	case "echo":
		return req.Params, nil
	}
	return nil, &MethodNotFoundError{Method: req.Method}
}

type pipeClient struct {
	w  io.WriteCloser
	sc *bufio.Scanner
}

func startStdio(t *testing.T, h Handler, opts ...Option) (*pipeClient, func()) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	s := NewServer(h, opts...)
	done := make(chan struct{})
	go func() {
		s.ServeStdio(context.Background(), inR, outW)
		outW.Close()
		close(done)
	}()
	sc := bufio.NewScanner(outR)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return &pipeClient{w: inW, sc: sc}, func() {
		inW.Close()
		outR.Close() // a reply racing the EOF fails instead of blocking
		<-done
	}
}

func (c *pipeClient) send(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(c.w, line+"\n")
	require.NoError(t, err)
}

func (c *pipeClient) read(t *testing.T) map[string]any {
	t.Helper()
	require.True(t, c.sc.Scan(), "response expected")
	var m map[string]any
	require.NoError(t, json.Unmarshal(c.sc.Bytes(), &m))
	return m
}

func TestNotificationsAndIDs(t *testing.T) {
	h := &blockingHandler{release: make(chan struct{})}
	c, stop := startStdio(t, h)
	defer stop()
	c.send(t, `{"jsonrpc":"2.0","method":"echo","params":{"a":1}}`)
	c.send(t, `{"jsonrpc":"2.0","id":"s-1","method":"echo","params":{"b":2}}`)
	r := c.read(t)
	assert.Equal(t, "s-1", r["id"], "the notification got no reply")
	assert.Equal(t, map[string]any{"b": float64(2)}, r["result"])
	// The notification runs on its own goroutine, unordered with the
	// request's: it is handled, not necessarily first.
	assert.Eventually(t, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.notifs == 1
	}, 5*time.Second, time.Millisecond, "the notification reached the handler")
	c.send(t, `{"jsonrpc":"2.0","id":18446744073709551615,"method":"nope"}`)
	r = c.read(t)
	assert.Equal(t, float64(18446744073709551615), r["id"])
	assert.Equal(t, float64(boxerr.ErrMethodNotFound.Code), r["error"].(map[string]any)["code"])
}

func TestDisconnectCancelsHandlers(t *testing.T) {
	h := &blockingHandler{release: make(chan struct{})}
	c, stop := startStdio(t, h)
	c.send(t, `{"jsonrpc":"2.0","id":1,"method":"wait"}`)
	time.Sleep(50 * time.Millisecond)
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ServeStdio did not return after EOF with a request in flight")
	}
}

// TestRequestOutlivesItsFrame: a request answered on its own goroutine
// keeps its id and params after the reading loop has read, into the same
// buffer, the lines sent after it (the fast decoder references the frame).
func TestRequestOutlivesItsFrame(t *testing.T) {
	release := make(chan struct{})
	h := funcHandler(func(ctx context.Context, req *Request) (json.RawMessage, error) {
		if req.Method == "held" {
			<-release
			assert.Equal(t, `"held-1"`, string(RequestIDFrom(ctx)))
		}
		return req.Params, nil
	})
	c, stop := startStdio(t, h, WithInline("echo"))
	defer stop()
	c.send(t, `{"jsonrpc":"2.0","id":"held-1","method":"held","params":{"n":"first"}}`)
	for i := range 20 {
		c.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":"echo-%d","method":"echo","params":{"x":"%s"}}`, i, strings.Repeat("z", i)))
		assert.Equal(t, fmt.Sprintf("echo-%d", i), c.read(t)["id"])
	}
	close(release)
	r := c.read(t)
	assert.Equal(t, "held-1", r["id"])
	assert.Equal(t, map[string]any{"n": "first"}, r["result"])
}

// TestInlineMethodAnsweredWhenBusy: an inline method (the heartbeat) is
// answered even while the connection is at its in-flight limit.
func TestInlineMethodAnsweredWhenBusy(t *testing.T) {
	h := &blockingHandler{release: make(chan struct{})}
	c, stop := startStdio(t, h, WithMaxInFlight(1), WithInline("echo"))
	defer stop()
	go func() {
		fmt.Fprint(c.w, `{"jsonrpc":"2.0","id":1,"method":"wait"}`+"\n")
		fmt.Fprint(c.w, `{"jsonrpc":"2.0","id":2,"method":"echo","params":{"alive":true}}`+"\n")
	}()
	r := c.read(t)
	assert.Equal(t, float64(2), r["id"])
	assert.Equal(t, map[string]any{"alive": true}, r["result"])
	close(h.release)
	assert.Equal(t, "released", c.read(t)["result"])
}

// TestInlineAnswerWrittenBeforeObserver: a lone inline call is answered
// before the observer (the call's log line and metrics) runs, not when the
// reading loop next comes round.
func TestInlineAnswerWrittenBeforeObserver(t *testing.T) {
	answered := make(chan struct{})
	sawAnswer := make(chan bool, 1)
	observe := func(Call) {
		select {
		case <-answered:
			sawAnswer <- true
		case <-time.After(5 * time.Second):
			sawAnswer <- false
		}
	}
	c, stop := startStdio(t, &blockingHandler{}, WithInline("echo"), WithObserver(observe))
	defer stop()
	c.send(t, `{"jsonrpc":"2.0","id":1,"method":"echo","params":{"alive":true}}`)
	assert.Equal(t, map[string]any{"alive": true}, c.read(t)["result"])
	close(answered)
	select {
	case saw := <-sawAnswer:
		assert.True(t, saw, "the answer waited for the observer")
	case <-time.After(10 * time.Second):
		t.Fatal("the observer never ran")
	}
}

// TestInlineCallAllocatesNothing: once a connection is warm, a heartbeat
// answered on the reading goroutine allocates nothing — not the request,
// its context, the answer nor its frame — so a host that only pings never
// sets the garbage collector going. Counted, not timed.
func TestInlineCallAllocatesNothing(t *testing.T) {
	var observed atomic.Int64
	observe := func(Call) { observed.Add(1) }
	none := funcHandler(func(context.Context, *Request) (json.RawMessage, error) { return nil, nil })
	c, stop := startStdio(t, none, WithInline("__ping"), WithObserver(observe))
	defer stop()
	ping := []byte(`{"jsonrpc":"2.0","id":12345,"method":"__ping","params":{}}` + "\n")
	call := func() {
		if _, err := c.w.Write(ping); err != nil {
			t.Fatal(err)
		}
		if !c.sc.Scan() {
			t.Fatal("no answer")
		}
	}
	for range 100 {
		call()
	}
	assert.Equal(t, `{"jsonrpc":"2.0","id":12345,"result":{}}`, c.sc.Text())
	assert.Zero(t, testing.AllocsPerRun(1000, call))
	// Each call's observer ran before the next request was read; the last
	// one's may still be running.
	assert.GreaterOrEqual(t, observed.Load(), int64(1100))
}

// funcHandler serves every request with one function.
type funcHandler func(ctx context.Context, req *Request) (json.RawMessage, error)

func (f funcHandler) Handle(ctx context.Context, req *Request) (json.RawMessage, error) {
	return f(ctx, req)
}

// countingWriter counts Write calls: each is one syscall on a real pipe.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

// serveAll serves in to completion on a writer that counts writes.
func serveAll(t *testing.T, h Handler, in string, opts ...Option) ([]map[string]any, int) {
	t.Helper()
	var out countingWriter
	NewServer(h, opts...).ServeStdio(context.Background(), strings.NewReader(in), &out)
	var msgs []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		msgs = append(msgs, m)
	}
	return msgs, out.writes
}

func TestServe(t *testing.T) {
	ok := funcHandler(func(context.Context, *Request) (json.RawMessage, error) { return json.RawMessage(`{"ok":true}`), nil })
	pings := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"ping"}`+"\n", i)
		}
		return b.String()
	}
	tests := []struct {
		name    string
		handler Handler
		opts    []Option
		in      string
		check   func(t *testing.T, msgs []map[string]any, writes int)
	}{
		{
			name: "inline answers to a buffered burst share one write", handler: ok, opts: []Option{WithInline("ping")}, in: pings(100),
			check: func(t *testing.T, msgs []map[string]any, writes int) {
				require.Len(t, msgs, 100)
				for i, m := range msgs {
					assert.Equal(t, float64(i), m["id"], "inline answers keep request order")
				}
				assert.Equal(t, 1, writes)
			},
		},
		{
			name: "notification sent on the request's connection before its answer",
			handler: funcHandler(func(ctx context.Context, req *Request) (json.RawMessage, error) {
				require.NoError(t, Notify(ctx, "box_exec_output", map[string]string{"chunk": "hi"}))
				return nil, nil
			}),
			in: `{"jsonrpc":"2.0","id":"n","method":"box_exec"}` + "\n",
			check: func(t *testing.T, msgs []map[string]any, _ int) {
				require.Len(t, msgs, 2)
				assert.Equal(t, map[string]any{"jsonrpc": "2.0", "method": "box_exec_output", "params": map[string]any{"chunk": "hi"}}, msgs[0])
				assert.Equal(t, map[string]any{"jsonrpc": "2.0", "id": "n", "result": map[string]any{}}, msgs[1])
			},
		},
		{
			name: "meta and transport reach the handler",
			handler: funcHandler(func(ctx context.Context, req *Request) (json.RawMessage, error) {
				m, ok := MetaFrom(ctx)
				require.True(t, ok)
				assert.Equal(t, req.Meta, m)
				return json.Marshal([]any{m.WorkspaceUUID, m.PlacementGeneration, TransportFrom(ctx)})
			}),
			in: `{"jsonrpc":"2.0","id":1,"method":"m","meta":{"instance_uuid":"i","workspace_uuid":"w","placement_generation":3}}` + "\n",
			check: func(t *testing.T, msgs []map[string]any, _ int) {
				require.Len(t, msgs, 1)
				assert.Equal(t, []any{"w", float64(3), TransportStdio}, msgs[0]["result"])
			},
		},
		{
			name: "answer over the message limit becomes an error",
			handler: funcHandler(func(context.Context, *Request) (json.RawMessage, error) {
				return json.Marshal(strings.Repeat("a", MaxMessageBytes))
			}),
			in: `{"jsonrpc":"2.0","id":"big","method":"m"}` + "\n",
			check: func(t *testing.T, msgs []map[string]any, _ int) {
				require.Len(t, msgs, 1)
				assert.Equal(t, "big", msgs[0]["id"])
				assert.Equal(t, float64(boxerr.ErrInternal.Code), msgs[0]["error"].(map[string]any)["code"])
			},
		},
		{
			name: "malformed frames are answered and the loop goes on", handler: ok, in: "nope\n[1]\n" + pings(1),
			check: func(t *testing.T, msgs []map[string]any, _ int) {
				require.Len(t, msgs, 3)
				assert.Equal(t, float64(boxerr.ErrParse.Code), msgs[0]["error"].(map[string]any)["code"])
				assert.Equal(t, float64(boxerr.ErrInvalidRequest.Code), msgs[1]["error"].(map[string]any)["code"])
				assert.Equal(t, map[string]any{"ok": true}, msgs[2]["result"])
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msgs, writes := serveAll(t, tc.handler, tc.in, tc.opts...)
			tc.check(t, msgs, writes)
		})
	}
}

// lineCodec is a second envelope, "<id> <method>" → "<id> ok|<error type>"
// and "! <method>" for notifications: the frame loop serves it unchanged.
type lineCodec struct{}

func (lineCodec) Decode(frame []byte, req *Request) (bool, error) {
	id, method, ok := strings.Cut(string(frame), " ")
	if !ok {
		return false, &DecodeError{Err: invalidRequest("want <id> <method>")}
	}
	*req = Request{Method: method, ID: json.RawMessage(id)}
	return true, nil
}

func (lineCodec) Encode(frames [][]byte, m Message) ([][]byte, error) {
	switch {
	case m.Method != "":
		return append(frames, []byte("! "+m.Method)), nil
	case m.Error != nil:
		return append(frames, []byte(string(orNull(m.ID))+" "+m.Error.Type)), nil
	}
	return append(frames, []byte(string(m.ID)+" ok")), nil
}

func TestCodecIsPluggable(t *testing.T) {
	h := funcHandler(func(ctx context.Context, req *Request) (json.RawMessage, error) {
		if req.Method == "tick" {
			return nil, Notify(ctx, "tock", nil)
		}
		return nil, &MethodNotFoundError{Method: req.Method}
	})
	var out bytes.Buffer
	NewServer(h, WithCodec(func() Codec { return lineCodec{} })).
		ServeStdio(context.Background(), strings.NewReader("1 tick\n2 nope\nbad\n"), &out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	sort.Strings(lines)
	assert.Equal(t, []string{"! tock", "1 ok", "2 MethodNotFound", "null InvalidRequest"}, lines)
}

func TestNotifyOutsideARequest(t *testing.T) {
	assert.Error(t, Notify(context.Background(), "m", nil))
}

// TestCancelRequest: $/cancelRequest cancels the context of the request
// with that id, however the id is spelled; the handler still answers, and
// unknown ids or malformed cancels change nothing.
func TestCancelRequest(t *testing.T) {
	h := funcHandler(func(ctx context.Context, req *Request) (json.RawMessage, error) {
		if req.Method != "wait" {
			return json.RawMessage(`"quick"`), nil
		}
		assert.Equal(t, string(req.ID), string(RequestIDFrom(ctx)))
		select {
		case <-ctx.Done():
			return json.RawMessage(`"canceled"`), nil
		case <-time.After(10 * time.Second):
			return json.RawMessage(`"not canceled"`), nil
		}
	})
	cases := []struct {
		name, id, cancel string
	}{
		{name: "number", id: `7`, cancel: `{"id":7}`},
		{name: "string", id: `"req-7"`, cancel: `{"id": "req-7"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, stop := startStdio(t, h)
			defer stop()
			go func() {
				fmt.Fprintf(c.w, `{"jsonrpc":"2.0","id":%s,"method":"wait"}`+"\n", tc.id)
				fmt.Fprint(c.w, `{"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"unknown"}}`+"\n")
				fmt.Fprint(c.w, `{"jsonrpc":"2.0","method":"$/cancelRequest","params":[]}`+"\n")
				fmt.Fprint(c.w, `{"jsonrpc":"2.0","id":8,"method":"other"}`+"\n")
			}()
			r := c.read(t)
			assert.Equal(t, "quick", r["result"], "a malformed or unknown cancel is ignored")
			go fmt.Fprintf(c.w, `{"jsonrpc":"2.0","method":"$/cancelRequest","params":%s}`+"\n", tc.cancel)
			r = c.read(t)
			assert.Equal(t, "canceled", r["result"])
		})
	}
}

// A request served outside a connection notifies through the context's
// Notifier, whichever Notify it uses; without one, Notify fails.
func TestNotifierOutsideAConnection(t *testing.T) {
	require.ErrorIs(t, Notify(context.Background(), "m", 1), errNotifyOutside)
	var got []string
	ctx := WithNotifier(context.Background(), func(method string, params json.RawMessage) error {
		got = append(got, method+" "+string(params))
		return nil
	})
	require.NoError(t, Notify(ctx, "a", map[string]int{"n": 1}))
	require.NoError(t, NotifyQueued(ctx, "b", 2))
	require.NoError(t, NotifyJSON(ctx, "c", json.RawMessage(`"x"`), true))
	assert.Equal(t, []string{`a {"n":1}`, "b 2", `c "x"`}, got)
}
