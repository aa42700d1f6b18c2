package reconnect

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// fakeServer is a JSON-RPC server that speaks boxrt's wire format with a
// handful of test methods. It runs in-process over WebSocket (newFakeWS) or
// a net.Pipe (pipeConnector), or as a child process: the test binary
// re-executed with fakeChildEnv set (see TestMain).
type fakeServer struct {
	token string

	stalled     atomic.Bool // requests are read and never answered
	pingErrors  atomic.Bool // __ping is answered with a busy error
	initFails   atomic.Bool // box_init answers BoxValidationError
	stopReading atomic.Bool // stop reading requests (the pipe fills up)
	inits       atomic.Int32
	pings       atomic.Int32

	mu       sync.Mutex
	methods  []string // arrival order, all connections
	queries  []string // raw query strings of WebSocket handshakes
	headers  []http.Header
	sockets  map[*websocket.Conn]struct{}
	refusing bool // handshakes get 503, as from a runtime that is down
	// gate, when set, holds box_init answers until it is closed.
	gate chan struct{}
	seen chan string // every arriving method, if set (non-blocking send)
	// canned answers the methods it names with the raw result given,
	// keeping their params in params (the typed calls' tests).
	canned map[string]json.RawMessage
	params map[string]json.RawMessage

	wg sync.WaitGroup // connection goroutines
}

type wireReq struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

type wireErr struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (f *fakeServer) record(method string) {
	f.mu.Lock()
	f.methods = append(f.methods, method)
	seen := f.seen
	f.mu.Unlock()
	if seen != nil {
		select {
		case seen <- method:
		default:
		}
	}
}

func (f *fakeServer) arrived() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.methods...)
}

func boxErr(code int64, typ, msg string, retryable bool) *wireErr {
	data, _ := json.Marshal(map[string]any{"type": typ, "retryable": retryable})
	return &wireErr{Code: code, Message: typ + ": " + msg, Data: data}
}

// dispatch answers one request; ok=false means no answer is sent.
func (f *fakeServer) dispatch(ctx context.Context, req wireReq) (result any, werr *wireErr, ok bool) {
	if f.stalled.Load() {
		return nil, nil, false
	}
	switch req.Method {
	case "__ping":
		f.pings.Add(1)
		if f.pingErrors.Load() {
			return nil, boxErr(ErrRuntimeUnavailable.Code, "BoxRuntimeUnavailableError", "Runtime connection is busy", true), true
		}
		return struct{}{}, nil, true
	case "box_init":
		f.mu.Lock()
		gate := f.gate
		f.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, nil, false
			}
		}
		f.inits.Add(1)
		if f.initFails.Load() {
			return nil, boxErr(ErrValidation.Code, "BoxValidationError", "limits.max_sessions must be positive", false), true
		}
		return map[string]bool{"initialized": true}, nil, true
	case "echo":
		return json.RawMessage(orNull(req.Params)), nil, true
	case "pid":
		return os.Getpid(), nil, true
	case "hang":
		<-ctx.Done()
		return nil, nil, false
	case "sleep":
		var p struct{ MS int }
		_ = json.Unmarshal(req.Params, &p)
		select {
		case <-time.After(time.Duration(p.MS) * time.Millisecond):
			return struct{}{}, nil, true
		case <-ctx.Done():
			return nil, nil, false
		}
	case "fail":
		var e wireErr
		_ = json.Unmarshal(req.Params, &e)
		return nil, &e, true
	case "stall":
		f.stalled.Store(true)
		return nil, nil, false
	case "stop_reading": // see serveLines
		return struct{}{}, nil, true
	case "stderr":
		var p struct{ Text string }
		_ = json.Unmarshal(req.Params, &p)
		fmt.Fprintln(os.Stderr, p.Text)
		return struct{}{}, nil, true
	case "exit":
		var p struct{ Code int }
		_ = json.Unmarshal(req.Params, &p)
		os.Exit(p.Code)
	}
	if result, ok := f.answerCanned(req); ok {
		return result, nil, true
	}
	data, _ := json.Marshal(map[string]any{"type": "MethodNotFound", "retryable": false, "method": req.Method})
	return nil, &wireErr{Code: ErrMethodNotFound.Code, Message: fmt.Sprintf("MethodNotFound: method %q not found", req.Method), Data: data}, true
}

func (f *fakeServer) answerCanned(req wireReq) (json.RawMessage, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	result, ok := f.canned[req.Method]
	if ok {
		if f.params == nil {
			f.params = map[string]json.RawMessage{}
		}
		f.params[req.Method] = req.Params
	}
	return result, ok
}

func orNull(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return json.RawMessage("null")
	}
	return b
}

func encodeResponse(id json.RawMessage, result any, werr *wireErr) []byte {
	m := map[string]any{"jsonrpc": "2.0", "id": id}
	if werr != nil {
		m["error"] = werr
	} else {
		m["result"] = result
	}
	b, _ := json.Marshal(m)
	return b
}

// serveLines serves one line-framed connection until r ends.
func (f *fakeServer) serveLines(r io.Reader, w io.Writer) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var wmu sync.Mutex
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 32<<20)
	for sc.Scan() {
		var req wireReq
		if json.Unmarshal(sc.Bytes(), &req) != nil || req.Method == "" {
			continue
		}
		f.record(req.Method)
		if req.Method == "stop_reading" {
			// Set here, not in the handler goroutine, so that no later
			// request is read.
			f.stopReading.Store(true)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			result, werr, ok := f.dispatch(ctx, req)
			if !ok || req.ID == nil {
				return
			}
			wmu.Lock()
			defer wmu.Unlock()
			_, _ = w.Write(append(encodeResponse(req.ID, result, werr), '\n'))
		}()
		for f.stopReading.Load() {
			time.Sleep(time.Hour) // the fake child is killed long before
		}
	}
	cancel()
	wg.Wait()
}

// pipeConnector returns a connector whose links are net.Pipe pairs served
// by f in-process, and a counter of links made.
func pipeConnector(f *fakeServer) (func(context.Context) (*link, error), *atomic.Int32) {
	var n atomic.Int32
	return func(context.Context) (*link, error) {
		n.Add(1)
		a, b := net.Pipe()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.serveLines(b, b)
			_ = b.Close()
		}()
		return newLink(newLineConn(a, a), nil, "pipe", testLogger()), nil
	}, &n
}

// fakeWS is fakeServer behind an httptest listener at /rpc/ws.
type fakeWS struct {
	*fakeServer
	srv *httptest.Server
	URL string // http://127.0.0.1:port
}

func newFakeWS(t *testing.T, token string) *fakeWS {
	t.Helper()
	f := &fakeWS{fakeServer: &fakeServer{token: token, sockets: map[*websocket.Conn]struct{}{}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /rpc/ws", f.serveHTTP)
	f.srv = httptest.NewServer(mux)
	f.URL = f.srv.URL
	t.Cleanup(f.close)
	return f
}

func (f *fakeWS) serveHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.queries = append(f.queries, r.URL.RawQuery)
	f.headers = append(f.headers, r.Header.Clone())
	refusing := f.refusing
	f.mu.Unlock()
	if refusing {
		http.Error(w, `{"error":{"type":"Unavailable","message":"down"}}`, http.StatusServiceUnavailable)
		return
	}
	if f.token != "" && r.Header.Get("Authorization") != "Bearer "+f.token {
		http.Error(w, `{"error":{"type":"Unauthorized","message":"missing or wrong control token"}}`, http.StatusUnauthorized)
		return
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	c.SetReadLimit(MaxMessageBytes)
	f.mu.Lock()
	f.sockets[c] = struct{}{}
	f.wg.Add(1)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.sockets, c)
		f.mu.Unlock()
		_ = c.CloseNow()
		f.wg.Done()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var handlers sync.WaitGroup
	defer handlers.Wait()
	defer cancel()
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		var req wireReq
		if json.Unmarshal(data, &req) != nil {
			continue
		}
		f.record(req.Method)
		handlers.Add(1)
		go func() {
			defer handlers.Done()
			result, werr, ok := f.dispatch(ctx, req)
			if ok && req.ID != nil {
				_ = c.Write(ctx, websocket.MessageText, encodeResponse(req.ID, result, werr))
			}
		}()
	}
}

// dropAll closes every open socket abruptly, as a crashed runtime would.
func (f *fakeWS) dropAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.sockets {
		_ = c.CloseNow()
	}
}

func (f *fakeWS) setRefusing(v bool) {
	f.mu.Lock()
	f.refusing = v
	f.mu.Unlock()
}

func (f *fakeWS) close() {
	f.stalled.Store(false)
	f.dropAll()
	f.srv.Close()
	f.wg.Wait()
}

// fakeChildEnv makes the test binary act as a stdio runtime (TestMain).
const fakeChildEnv = "RECONNECT_FAKE_CHILD"

func runFakeChild() {
	if msg := os.Getenv("FAKE_CHILD_EXIT"); msg != "" {
		fmt.Fprintln(os.Stderr, msg)
		status, err := strconv.Atoi(os.Getenv("FAKE_CHILD_EXIT_STATUS"))
		if err != nil {
			status = 2
		}
		os.Exit(status)
	}
	if os.Getenv("FAKE_CHILD_BANNER") != "" {
		fmt.Println("fake runtime starting (not JSON)")
	}
	f := &fakeServer{}
	if os.Getenv("FAKE_CHILD_INIT_FAILS") != "" {
		f.initFails.Store(true)
	}
	fmt.Fprintln(os.Stderr, "fake child ready")
	f.serveLines(os.Stdin, os.Stdout)
}

// fakeChildCommand returns options that spawn the fake child.
func fakeChildCommand(env ...string) []Option {
	return []Option{
		WithCommand(os.Args[0], "-test.run=^$"),
		// GORACE: a -race child otherwise sleeps 1 s before exiting.
		WithEnv(append(append(os.Environ(), fakeChildEnv+"=1", "GORACE=atexit_sleep_ms=0"), env...)),
		WithStderr(io.Discard),
	}
}

// testLogger logs to stderr when RECONNECT_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("RECONNECT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stateLog records state changes.
type stateLog struct {
	mu     sync.Mutex
	events []stateEvent
}

type stateEvent struct {
	s   State
	err error
	at  time.Time
}

func (l *stateLog) hook(s State, err error) {
	l.mu.Lock()
	l.events = append(l.events, stateEvent{s, err, time.Now()})
	l.mu.Unlock()
}

func (l *stateLog) count(s State) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.s == s {
			n++
		}
	}
	return n
}

func (l *stateLog) first(s State) (stateEvent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.s == s {
			return e, true
		}
	}
	return stateEvent{}, false
}

func (l *stateLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, e := range l.events {
		fmt.Fprintf(&b, "%s %v; ", e.s, e.err)
	}
	return b.String()
}
