package reconnect

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/boxrt/boxrt/internal/dialout"
)

const listenerToken = "listener-test-token-0123456789abcdef"

// fakeDialer is a runtime in this process that dials a Listener: it
// answers __ping at once and holds "hold" calls until released, keeping
// at most two answers for replay.
type fakeDialer struct {
	t    *testing.T
	url  string
	conn *dialout.Conn
	held chan json.RawMessage // ids of the "hold" calls received
	link *dialout.Link
}

func newFakeDialer(t *testing.T, url string) *fakeDialer {
	return &fakeDialer{t: t, url: url, held: make(chan json.RawMessage, 16)}
}

func (f *fakeDialer) dial(token string) (*websocket.Conn, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return websocket.Dial(ctx, f.url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
}

// connect dials and starts or resumes the logical connection.
func (f *fakeDialer) connect() {
	ws, _, err := f.dial(listenerToken)
	require.NoError(f.t, err)
	f.link = dialout.NewLink(ws, nil, 0, 0)
	ctx := context.Background()
	if f.conn != nil {
		err = f.conn.Resume(f.link, func(received uint64) (uint64, error) {
			w, err := dialout.Exchange(ctx, ws, dialout.Hello{RuntimeID: "rt-1", ConnID: f.conn.ID(), Received: received})
			require.True(f.t, w.Resumed)
			return w.Received, err
		})
		require.NoError(f.t, err)
		return
	}
	w, err := dialout.Exchange(ctx, ws, dialout.Hello{RuntimeID: "rt-1"})
	require.NoError(f.t, err)
	f.conn = dialout.NewConn(w.ConnID, dialout.Options{Window: time.Minute, Limits: dialout.Limits{KeepFrames: 2, KeepBytes: 1 << 20, BulkBytes: 1 << 20},
		OnLost: func(_ string, lost dialout.Lost) ([]byte, [][]byte) {
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": AnswersLostNotification, "params": map[string]any{"ids": lost.IDs, "notifications_lost": lost.Bulk}})
			return b, nil
		}})
	require.NoError(f.t, f.conn.Resume(f.link, func(uint64) (uint64, error) { return 0, nil }))
	go f.serve()
}

func (f *fakeDialer) serve() {
	for {
		frame, err := f.conn.ReadFrame()
		if err != nil {
			return
		}
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(frame, &req) != nil || req.ID == nil {
			continue
		}
		if req.Method == "hold" {
			f.held <- append(json.RawMessage(nil), req.ID...)
			continue
		}
		f.answer(req.ID)
	}
}

func (f *fakeDialer) answer(id json.RawMessage) {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "result": map[string]any{"id": id}})
	require.NoError(f.t, f.conn.WriteFrame(b))
}

func newTestListener(t *testing.T) (*Listener, *httptest.Server) {
	l, err := NewListener([]string{"another-token-nobody-uses-0123456789", listenerToken}, WithHeartbeat(50*time.Millisecond, 50*time.Millisecond, 2))
	require.NoError(t, err)
	srv := httptest.NewServer(l)
	t.Cleanup(func() {
		_ = l.Close()
		srv.Close()
	})
	return l, srv
}

func TestListenerRefusesBadCredentials(t *testing.T) {
	_, srv := newTestListener(t)
	f := newFakeDialer(t, "ws"+strings.TrimPrefix(srv.URL, "http"))
	_, resp, err := f.dial("wrong-token-0123456789abcdef0123456789")
	require.Error(t, err)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	f.url += "?access_token=" + listenerToken
	_, resp, err = f.dial(listenerToken)
	require.Error(t, err)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a token in the URL is refused even with the right header")
	_, err = NewListener(nil)
	assert.Error(t, err, "a listener without tokens would admit anyone")
}

// A call in flight survives a dropped WebSocket and is answered after
// the resumption; answers the runtime could not keep fail their calls;
// the heartbeat does not give up on a runtime that is away.
func TestListenerResumesAndFailsLostAnswers(t *testing.T) {
	l, srv := newTestListener(t)
	f := newFakeDialer(t, "ws"+strings.TrimPrefix(srv.URL, "http"))
	f.connect()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	require.NoError(t, err)
	assert.Equal(t, "rt-1", c.RuntimeID())

	results := make([]chan error, 4)
	for i := range results {
		results[i] = make(chan error, 1)
		go func() { results[i] <- c.Call(ctx, "hold", nil, nil) }()
	}
	var ids []json.RawMessage
	for range results {
		ids = append(ids, <-f.held)
	}
	f.link.Close()
	time.Sleep(300 * time.Millisecond) // several heartbeats while away
	for _, id := range ids {           // 4 answers, 2 kept
		f.answer(id)
	}
	f.connect()
	var lost, ok int
	for _, r := range results {
		switch err := <-r; {
		case err == nil:
			ok++
		case errors.Is(err, ErrRuntimeUnavailable):
			var e *Error
			require.ErrorAs(t, err, &e)
			assert.False(t, e.Retryable, "the call ran; only its answer was lost")
			lost++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	assert.Equal(t, 2, ok, "the answers kept were replayed")
	assert.Equal(t, 2, lost, "the answers evicted were reported lost")
	assert.Equal(t, 1, c.Status().Connects, "resumed, not reconnected")
	require.NoError(t, c.Call(ctx, "__ping", nil, nil))
}

// Accept hands out one Client per runtime; a runtime the host closed
// comes back as a new one.
func TestListenerOneClientPerRuntime(t *testing.T) {
	l, srv := newTestListener(t)
	f := newFakeDialer(t, "ws"+strings.TrimPrefix(srv.URL, "http"))
	f.connect()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Close())

	var wg sync.WaitGroup
	f2 := newFakeDialer(t, f.url)
	wg.Add(1)
	go func() { defer wg.Done(); f2.connect() }()
	c2, err := l.Accept(ctx)
	require.NoError(t, err)
	wg.Wait()
	assert.NotSame(t, c, c2)
	require.NoError(t, c2.Call(ctx, "__ping", nil, nil))
	f.conn.End(nil)
	f2.conn.End(nil)
}
