package dialout

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// pair is a host Conn served by an httptest server and a runtime Conn
// dialing it, linked by real WebSockets.
type pair struct {
	t             *testing.T
	srv           *httptest.Server
	host, runtime *Conn
	hostLink      chan *Link
	streams       *Listener
}

func newPair(t *testing.T, runtimeOpts Options) *pair {
	p := &pair{t: t, host: NewConn("c1", Options{Window: time.Minute}), runtime: NewConn("c1", runtimeOpts),
		hostLink: make(chan *Link, 4), streams: NewListener()}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		h, err := ReadHello(r.Context(), ws)
		if err != nil {
			t.Error(err)
			return
		}
		l := NewLink(ws, nil, 0, 0)
		err = p.host.Resume(l, func(received uint64) (uint64, error) {
			return h.Received, WriteWelcome(r.Context(), ws, Welcome{ConnID: "c1", Resumed: true, Received: received})
		})
		if err != nil {
			t.Error(err)
			return
		}
		p.hostLink <- l
		<-l.Done()
	}))
	t.Cleanup(func() {
		p.host.End(nil)
		p.runtime.End(nil)
		p.srv.Close()
		p.streams.Close()
	})
	return p
}

// connect dials one link for the runtime and returns both ends.
func (p *pair) connect() (runtimeLink, hostLink *Link) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws"+p.srv.URL[len("http"):], nil)
	if err != nil {
		p.t.Fatal(err)
	}
	l := NewLink(ws, p.streams.Offer, 0, 0)
	err = p.runtime.Resume(l, func(received uint64) (uint64, error) {
		w, err := Exchange(ctx, ws, Hello{RuntimeID: "rt", ConnID: "c1", Received: received})
		return w.Received, err
	})
	if err != nil {
		p.t.Fatal(err)
	}
	return l, <-p.hostLink
}

func read(t *testing.T, c *Conn) string {
	t.Helper()
	f, err := c.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	return string(f)
}

func TestConnResumesAndReplays(t *testing.T) {
	var mu sync.Mutex
	var lost []Lost
	p := newPair(t, Options{Window: time.Minute, Limits: Limits{KeepFrames: 2, KeepBytes: 1 << 20, BulkBytes: 1 << 20},
		OnLost: func(_ string, l Lost) ([]byte, [][]byte) {
			mu.Lock()
			lost = append(lost, l)
			mu.Unlock()
			return []byte(`{"lost":true}`), [][]byte{[]byte(`{"local":true}`)}
		}})
	rl, _ := p.connect()
	must(t, p.runtime.WriteFrame(answer(1)))
	must(t, p.host.WriteFrame([]byte(`{"id":10}`)))
	if got := read(t, p.host); got != string(answer(1)) {
		t.Fatalf("host read %q", got)
	}
	if got := read(t, p.runtime); got != `{"id":10}` {
		t.Fatalf("runtime read %q", got)
	}

	// The link breaks; the runtime answers three calls meanwhile, one more
	// than it keeps; the host sends a request.
	done := make(chan string, 1)
	go func() { f, _ := p.runtime.ReadFrame(); done <- string(f) }()
	rl.Close()
	waitDetached(t, p.runtime)
	for id := 2; id <= 4; id++ {
		must(t, p.runtime.WriteFrame(answer(id)))
	}
	must(t, p.host.WriteFrame([]byte(`{"id":11}`)))
	hostRead := make(chan string, 3)
	go func() { // the host reads on, as its client does
		for range 3 {
			f, _ := p.host.ReadFrame()
			hostRead <- string(f)
		}
	}()
	p.connect()
	if got := <-hostRead; got != string(answer(3)) {
		t.Errorf("first replayed answer %q, want answer 3 (2 was evicted)", got)
	}
	if got := <-hostRead; got != string(answer(4)) {
		t.Errorf("second replayed answer %q", got)
	}
	if got := <-hostRead; got != `{"lost":true}` {
		t.Errorf("OnLost's notice follows the replay: got %q", got)
	}
	if got := <-done; got != `{"local":true}` {
		t.Errorf("OnLost's local frame comes first: got %q", got)
	}
	if got := read(t, p.runtime); got != `{"id":11}` {
		t.Errorf("the host's request was not replayed: %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 1 || len(lost[0].IDs) != 1 || string(lost[0].IDs[0]) != "2" {
		t.Errorf("lost = %+v, want the id 2", lost)
	}
}

func TestConnEndsAfterItsWindow(t *testing.T) {
	c := NewConn("w", Options{Window: 50 * time.Millisecond})
	if _, err := c.ReadFrame(); err != ErrExpired {
		t.Fatalf("ReadFrame = %v, want ErrExpired", err)
	}
	if err := c.WriteFrame([]byte("{}")); err != ErrExpired {
		t.Errorf("WriteFrame after expiry = %v", err)
	}
}

func TestStreamsFlowControlled(t *testing.T) {
	p := newPair(t, Options{Window: time.Minute})
	_, hl := p.connect()
	go func() {
		for {
			if _, err := p.runtime.ReadFrame(); err != nil {
				return
			}
		}
	}()
	go func() {
		for {
			if _, err := p.host.ReadFrame(); err != nil {
				return
			}
		}
	}()
	// A stream nobody reads on the runtime's side fills its window and
	// then waits, without holding up another stream or the frames.
	stalled, err := hl.Mux().Open()
	must(t, err)
	wrote := make(chan int, 1)
	go func() {
		_ = stalled.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
		n, _ := stalled.Write(make([]byte, 2*StreamWindow))
		wrote <- n
	}()
	if _, err := p.streams.Accept(); err != nil { // accepted, never read
		t.Fatal(err)
	}
	if n := <-wrote; n != StreamWindow {
		t.Errorf("wrote %d bytes unread, want the window (%d)", n, StreamWindow)
	}

	echo, err := hl.Mux().Open()
	must(t, err)
	srv, err := p.streams.Accept()
	must(t, err)
	go func() { _, _ = io.Copy(srv, srv); _ = srv.Close() }()
	payload := bytes.Repeat([]byte("x"), 3*StreamWindow+17)
	go func() { _, _ = echo.Write(payload); _ = echo.SetReadDeadline(time.Now().Add(10 * time.Second)) }()
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(echo, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Error("echoed bytes differ")
	}
	must(t, echo.Close())
	must(t, p.host.WriteFrame([]byte(`{"still":"flowing"}`)))
}

func waitDetached(t *testing.T, c *Conn) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.Attached() {
		if time.Now().After(deadline) {
			t.Fatal("the broken link was not detached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
