package rpc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/boxrt/boxrt/runtime/boxerr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func nopLogger() zerolog.Logger { return zerolog.Nop() }

// blockingHandler answers "wait" only when released and everything else at
// once.
type blockingHandler struct {
	release chan struct{}
	mu      sync.Mutex
	notifs  int
}

func (h *blockingHandler) Handle(ctx context.Context, req *Request) (any, error) {
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
		return "released", nil
	case "echo":
		return json.RawMessage(req.Params), nil
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

func TestInFlightLimit(t *testing.T) {
	h := &blockingHandler{release: make(chan struct{})}
	c, stop := startStdio(t, h, WithMaxInFlight(4), WithErrorEncoder(func(err error) *Error {
		return &Error{Code: -32002, Type: "BoxRuntimeUnavailableError", Message: err.Error(), Retryable: true}
	}))
	defer stop()
	// io.Pipe has no buffer: send from another goroutine, as a kernel pipe
	// would let the writer run ahead.
	go func() {
		for i := range 6 {
			fmt.Fprintf(c.w, `{"jsonrpc":"2.0","id":%d,"method":"wait"}`+"\n", i)
		}
	}()
	for range 2 {
		r := c.read(t)
		errObj := r["error"].(map[string]any)
		assert.Equal(t, float64(-32002), errObj["code"])
		assert.Contains(t, []any{float64(4), float64(5)}, r["id"], "the 5th and 6th are refused")
	}
	close(h.release)
	for range 4 {
		r := c.read(t)
		assert.Equal(t, "released", r["result"])
	}
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
	h.mu.Lock()
	assert.Equal(t, 1, h.notifs)
	h.mu.Unlock()
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
