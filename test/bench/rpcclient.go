package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("rpc error %d: %s", e.Code, e.Message) }

type response struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *rpcError       `json:"error"`
}

// transport moves whole JSON-RPC messages. The same client code drives
// boxrt and the echo baselines, so the client's own cost is in both sides
// of every ratio.
type transport interface {
	Send(ctx context.Context, msg []byte) error
	// Recv returns the next message, valid until the next Recv.
	Recv(ctx context.Context) ([]byte, error)
	Close() error
}

// client is a JSON-RPC 2.0 client. Multiplexed (newRPCClient), any number
// of goroutines may call concurrently over one connection and a reader
// goroutine routes responses to callers by id. Direct (newDirectClient),
// calls take turns and each reads its own answer on the calling goroutine.
type rpcClient struct {
	t       transport
	nextID  atomic.Uint64
	sendMu  sync.Mutex
	mu      sync.Mutex
	pending map[uint64]chan response
	readErr error
	done    chan struct{}
	// notify, when set, gets every message without an id (box_exec_output
	// notifications), on the reading goroutine.
	notify atomic.Pointer[func(msg []byte)]
	// direct: no reader goroutine (see newDirectClient).
	direct bool
}

var notificationPrefix = []byte(`{"jsonrpc":"2.0","method":`)

func newRPCClient(t transport) *rpcClient {
	c := &rpcClient{t: t, pending: map[uint64]chan response{}, done: make(chan struct{})}
	go c.readLoop()
	return c
}

// newDirectClient is a client whose calls take turns, each writing its
// request and reading until its answer on the calling goroutine. With one
// caller, the round trip is then the peer's and the pipe's alone: a reader
// goroutine handing the answer over wakes a second thread, often on the
// other core, which on a machine whose idle vCPUs halt costs tens of µs
// or nothing depending on where the caller was parked.
func newDirectClient(t transport) *rpcClient {
	c := &rpcClient{t: t, pending: map[uint64]chan response{}, done: make(chan struct{}), direct: true}
	close(c.done)
	return c
}

// newClient is a direct or a multiplexed client on t.
func newClient(t transport, direct bool) *rpcClient {
	if direct {
		return newDirectClient(t)
	}
	return newRPCClient(t)
}

func (c *rpcClient) readLoop() {
	defer close(c.done)
	for {
		msg, err := c.t.Recv(context.Background())
		if err != nil {
			c.mu.Lock()
			c.readErr = err
			for id, ch := range c.pending {
				close(ch)
				delete(c.pending, id)
			}
			c.mu.Unlock()
			return
		}
		id, r, ok := c.answer(msg)
		if !ok {
			continue
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// answer decodes msg as the answer to a call; anything else goes to
// notify or, if it cannot be read, nowhere (ok false).
func (c *rpcClient) answer(msg []byte) (id uint64, r response, ok bool) {
	// A notification (boxrt writes them with this prefix) goes to notify
	// undecoded: streamed output is most of the bytes, and decoding each
	// message twice made the harness, not boxrt, the bottleneck of the
	// stream scenario.
	if bytes.HasPrefix(msg, notificationPrefix) {
		if fn := c.notify.Load(); fn != nil {
			(*fn)(msg)
		}
		return 0, r, false
	}
	if err := json.Unmarshal(msg, &r); err != nil {
		return 0, r, false
	}
	if r.ID == nil {
		if fn := c.notify.Load(); fn != nil {
			(*fn)(msg)
		}
		return 0, r, false
	}
	id, err := strconv.ParseUint(string(r.ID), 10, 64)
	if err != nil {
		return 0, r, false // id null: a framing error answer; nobody waits on it
	}
	return id, r, true
}

// Call sends one request and waits for its response. params may be nil
// (sent as {}), a json.RawMessage or anything json.Marshal takes.
func (c *rpcClient) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	id := c.nextID.Add(1)
	var p []byte
	switch v := params.(type) {
	case nil:
		p = []byte("{}")
	case json.RawMessage:
		p = v
	default:
		var err error
		if p, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	msg := make([]byte, 0, 64+len(method)+len(p))
	msg = append(msg, `{"jsonrpc":"2.0","id":`...)
	msg = strconv.AppendUint(msg, id, 10)
	msg = append(msg, `,"method":`...)
	msg = strconv.AppendQuote(msg, method)
	msg = append(msg, `,"params":`...)
	msg = append(msg, p...)
	msg = append(msg, '}')
	if c.direct {
		return c.callDirect(ctx, method, id, msg)
	}

	ch := make(chan response, 1)
	c.mu.Lock()
	if c.readErr != nil {
		err := c.readErr
		c.mu.Unlock()
		return nil, fmt.Errorf("connection closed: %w", err)
	}
	c.pending[id] = ch
	c.mu.Unlock()

	c.sendMu.Lock()
	err := c.t.Send(ctx, msg)
	c.sendMu.Unlock()
	if err != nil {
		c.forget(id)
		return nil, err
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return nil, fmt.Errorf("connection closed while waiting for %s: %v", method, c.err())
		}
		if r.Error != nil {
			return nil, r.Error
		}
		return r.Result, nil
	case <-ctx.Done():
		c.forget(id)
		return nil, fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

func (c *rpcClient) callDirect(ctx context.Context, method string, id uint64, msg []byte) (json.RawMessage, error) {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.t.Send(ctx, msg); err != nil {
		return nil, err
	}
	for {
		b, err := c.t.Recv(ctx)
		if err != nil {
			return nil, fmt.Errorf("connection closed while waiting for %s: %w", method, err)
		}
		if got, r, ok := c.answer(b); ok && got == id {
			if r.Error != nil {
				return nil, r.Error
			}
			return r.Result, nil
		}
	}
}

// CallInto calls and decodes the result into out.
func (c *rpcClient) CallInto(ctx context.Context, method string, params, out any) error {
	res, err := c.Call(ctx, method, params)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(res, out)
}

func (c *rpcClient) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *rpcClient) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

func (c *rpcClient) Close() error {
	err := c.t.Close()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
	}
	return err
}

// lineTransport is the stdio framing: one JSON object per line.
type lineTransport struct {
	w    io.WriteCloser
	r    *bufio.Reader
	long []byte // reused for lines longer than r's buffer
}

func newLineTransport(w io.WriteCloser, r io.Reader) *lineTransport {
	return &lineTransport{w: w, r: bufio.NewReaderSize(r, 1<<20)}
}

func (l *lineTransport) Send(_ context.Context, msg []byte) error {
	buf := make([]byte, len(msg)+1)
	copy(buf, msg)
	buf[len(msg)] = '\n'
	_, err := l.w.Write(buf) // one write: the line reaches the peer whole
	return err
}

// Recv returns a line in the reader's buffer when it fits: the stream
// scenario reads 200 MB of notifications through it, and a copy of every
// line made the harness's allocations, not boxrt, part of what it timed.
func (l *lineTransport) Recv(_ context.Context) ([]byte, error) {
	for {
		line, err := l.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			l.long = append(l.long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = l.r.ReadSlice('\n')
				l.long = append(l.long, line...)
			}
			line = l.long
		}
		if len(line) > 1 && line[len(line)-1] == '\n' {
			return line[:len(line)-1], nil
		}
		if err != nil {
			if len(line) > 0 {
				return line, nil
			}
			return nil, err
		}
	}
}

func (l *lineTransport) Close() error { return l.w.Close() }

// wsTransport is one JSON-RPC message per WebSocket text frame.
type wsTransport struct {
	c *websocket.Conn
}

func dialWS(ctx context.Context, url, token string) (*wsTransport, error) {
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(64 << 20)
	return &wsTransport{c: c}, nil
}

func (w *wsTransport) Send(ctx context.Context, msg []byte) error {
	return w.c.Write(ctx, websocket.MessageText, msg)
}

func (w *wsTransport) Recv(ctx context.Context) ([]byte, error) {
	typ, b, err := w.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != websocket.MessageText {
		return nil, errors.New("unexpected binary frame")
	}
	return b, nil
}

func (w *wsTransport) Close() error { return w.c.Close(websocket.StatusNormalClosure, "") }
