package reconnect

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/boxrt/boxrt/internal/dialout"
)

// Listener is the host's side of runtimes that dial it (`boxrt serve
// --connect wss://HOST/PATH`, for sandbox machines behind NAT): an
// http.Handler to mount on the host's HTTPS server at PATH. It
// authenticates each runtime (its "Authorization: Bearer" token against
// the host's configured tokens, compared in constant time), and hands the
// host one Client per runtime (Accept), the same Client that Spawn and
// Dial return, with the same calls, streams and file helpers.
//
// A runtime's WebSockets come and go; its Client stays. Within a logical
// connection (docs/protocol.md, "Dial-out runtimes") a dropped WebSocket
// is resumed when the runtime dials again: calls in flight keep waiting,
// their answers arrive after the resumption, and what neither side could
// replay fails with ErrRuntimeUnavailable (answers lost: not retryable,
// the call ran). The heartbeat pauses while the runtime is away. A
// runtime the host does not know (a host restart, or its Client closed)
// starts a new logical connection, which a new Client serves.
//
// A runtime names itself (its instance id) in its handshake, and the
// Client of a runtime is tied to the token it first presented: give each
// runtime its own token where one runtime must not be able to take over
// another's Client.
type Listener struct {
	tokens   [][]byte
	opts     []Option
	accepted chan *Client
	ctx      context.Context
	cancel   context.CancelFunc

	mu       sync.Mutex
	runtimes map[string]*dialedRuntime
	wg       sync.WaitGroup // ServeHTTP calls and Client watchers
}

// DialedRuntimeWindow is how long a runtime that dialed in and dropped is
// waited for before its logical connection ends (the runtime keeps its own
// for as long).
const DialedRuntimeWindow = 5 * time.Minute

// MaxDialedRuntimes bounds the runtimes one Listener serves at once.
const MaxDialedRuntimes = 4096

// dialedKeepalive: the host pings each runtime's WebSocket this often, so
// a silently dead one is noticed and the runtime's next dial resumes.
const dialedKeepalive = 20 * time.Second

// NewListener returns a Listener accepting runtimes that present one of
// tokens; opts configure the Clients it makes (heartbeat, OnConnect, logger,
// notifications; spawn and dial options do not apply).
func NewListener(tokens []string, opts ...Option) (*Listener, error) {
	if len(tokens) == 0 {
		return nil, errors.New("reconnect: NewListener: no token; runtimes must authenticate")
	}
	l := &Listener{opts: opts, accepted: make(chan *Client, 16), runtimes: map[string]*dialedRuntime{}}
	for _, t := range tokens {
		if strings.TrimSpace(t) == "" {
			return nil, errors.New("reconnect: NewListener: an empty token")
		}
		l.tokens = append(l.tokens, []byte(t))
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// Accept returns the Client of the next runtime that dialed in, once its
// first link passed the handshake (__ping, OnConnect).
func (l *Listener) Accept(ctx context.Context) (*Client, error) {
	select {
	case c := <-l.accepted:
		return c, nil
	case <-l.ctx.Done():
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close refuses new runtimes, closes every Client it made and waits for
// its WebSockets to end.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.cancel() // under mu: no ServeHTTP joins wg after this
	rts := make([]*dialedRuntime, 0, len(l.runtimes))
	for _, rt := range l.runtimes {
		rts = append(rts, rt)
	}
	l.mu.Unlock()
	for _, rt := range rts {
		_ = rt.client.Close()
	}
	l.wg.Wait()
	return nil
}

// ServeHTTP accepts one WebSocket of a runtime and serves it until it
// breaks.
func (l *Listener) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for k := range r.URL.Query() {
		if strings.Contains(strings.ToLower(k), "token") {
			http.Error(w, "BoxValidationError: a token in the URL is refused; send it as Authorization: Bearer", http.StatusBadRequest)
			return
		}
	}
	token, ok := l.authenticate(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="boxrt"`)
		http.Error(w, "BoxPermissionError: missing or wrong control token (Authorization: Bearer)", http.StatusUnauthorized)
		return
	}
	l.mu.Lock()
	if l.ctx.Err() != nil {
		l.mu.Unlock()
		http.Error(w, "BoxRuntimeUnavailableError: the host is shutting down", http.StatusServiceUnavailable)
		return
	}
	l.wg.Add(1)
	l.mu.Unlock()
	defer l.wg.Done()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{dialout.Subprotocol}})
	if err != nil {
		return
	}
	if err := l.serveLink(ws, token); err != nil {
		l.logger().Warn("boxrt: dialed-in runtime refused", "remote", r.RemoteAddr, "err", err)
		_ = ws.Close(websocket.StatusPolicyViolation, clipReason(err.Error()))
	}
}

// authenticate returns the token the header presents if it is one of the
// host's; every token is compared, in constant time.
func (l *Listener) authenticate(header string) (string, bool) {
	got, ok := strings.CutPrefix(header, "Bearer ")
	if !ok {
		return "", false
	}
	match := 0
	for _, t := range l.tokens {
		match |= subtle.ConstantTimeCompare([]byte(got), t)
	}
	return got, match == 1
}

func (l *Listener) serveLink(ws *websocket.Conn, token string) error {
	ctx, cancel := context.WithTimeout(l.ctx, 15*time.Second)
	defer cancel()
	hello, err := dialout.ReadHello(ctx, ws)
	if err != nil {
		return err
	}
	rt, err := l.runtime(hello.RuntimeID, token)
	if err != nil {
		return err
	}
	link := dialout.NewLink(ws, nil, dialedKeepalive, dialedKeepalive/2)
	if err := rt.attach(ctx, link, ws, hello); err != nil {
		link.Close()
		return err
	}
	select {
	case <-link.Done():
	case <-l.ctx.Done():
		link.CloseWith(websocket.StatusGoingAway, "host shutting down")
	}
	return nil
}

// runtime returns the runtime's entry, making it and its Client when it is
// new.
func (l *Listener) runtime(id, token string) (*dialedRuntime, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A runtime whose Client the host closed is a new runtime to it.
	if rt := l.runtimes[id]; rt != nil && rt.client.ctx.Err() == nil {
		if subtle.ConstantTimeCompare([]byte(rt.token), []byte(token)) != 1 {
			return nil, fmt.Errorf("runtime %s came back with another token than its Client uses; close that Client first", id)
		}
		return rt, nil
	}
	if l.ctx.Err() != nil {
		return nil, ErrClosed
	}
	if len(l.runtimes) >= MaxDialedRuntimes {
		return nil, fmt.Errorf("%d runtimes are connected, the limit; close some Clients", MaxDialedRuntimes)
	}
	rt := &dialedRuntime{id: id, token: token, conns: make(chan *dialedConn, 1)}
	rt.client = l.newClient(rt)
	l.runtimes[id] = rt
	l.wg.Add(1)
	go l.watch(rt)
	return rt, nil
}

// watch hands the runtime's Client to Accept once its first link is up,
// and forgets the runtime when the Client ends.
func (l *Listener) watch(rt *dialedRuntime) {
	defer l.wg.Done()
	c := rt.client
	select {
	case err := <-c.first:
		if err == nil {
			select {
			case l.accepted <- c:
			default:
				l.logger().Warn("boxrt: dialed-in runtime dropped: nobody accepts runtimes", "runtime", rt.id)
				_ = c.Close()
			}
		} else {
			_ = c.Close()
		}
	case <-c.done:
	}
	<-c.done
	l.mu.Lock()
	if l.runtimes[rt.id] == rt {
		delete(l.runtimes, rt.id)
	}
	l.mu.Unlock()
	rt.end()
}

func (l *Listener) newClient(rt *dialedRuntime) *Client {
	o := buildOptions(l.opts)
	o.token, o.tokenSet = rt.token, true
	// The runtime's HTTP routes (relay, files) are streams of its
	// connection: the host name is a placeholder nothing resolves.
	o.httpBase = "http://boxrt-dialout.invalid"
	hc := &http.Client{Transport: &http.Transport{
		DialContext:         func(context.Context, string, string) (net.Conn, error) { return rt.openStream() },
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}
	o.httpClient = hc
	o.connector = rt.connect(&o)
	c := newClient(o)
	c.ownHTTP = hc
	c.runtimeID = rt.id
	go c.run()
	return c
}

func (l *Listener) logger() interface{ Warn(string, ...any) } {
	return buildOptions(l.opts).logger
}

// clipReason keeps a close reason within the WebSocket's 123 bytes.
func clipReason(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}

// RuntimeID names the runtime of a Client that Listener.Accept returned
// (its instance id); "" for Spawn and Dial.
func (c *Client) RuntimeID() string { return c.runtimeID }

// HTTP returns the runtime's HTTP origin and the client that reaches it,
// for its routes the typed helpers do not cover (the managed-process
// relay: BASE/v1/sessions/{id}/managed-process/{pid}/ws with
// websocket.DialOptions{HTTPClient: hc}). For a runtime that dialed in, the
// requests travel as streams of its connection.
func (c *Client) HTTP() (base string, hc *http.Client) {
	return c.o.httpBase, c.httpClient()
}

// dialedRuntime is one runtime that dialed in: its current logical
// connection and its Client.
type dialedRuntime struct {
	id, token string
	client    *Client
	// conns hands a new logical connection to the Client's connector.
	conns chan *dialedConn

	mu   sync.Mutex
	conn *dialout.Conn // the newest logical connection
}

// attach resumes the runtime's logical connection on link, or starts a
// new one when the runtime names none or one the host does not have.
func (rt *dialedRuntime) attach(ctx context.Context, link *dialout.Link, ws *websocket.Conn, hello dialout.Hello) error {
	rt.mu.Lock()
	conn := rt.conn
	rt.mu.Unlock()
	if conn != nil && hello.ConnID == conn.ID() && !conn.Ended() {
		return conn.Resume(link, func(received uint64) (uint64, error) {
			return hello.Received, dialout.WriteWelcome(ctx, ws, dialout.Welcome{ConnID: conn.ID(), Resumed: true, Received: received})
		})
	}
	if conn != nil {
		conn.End(errors.New("the runtime started a new connection"))
	}
	id, err := newConnID()
	if err != nil {
		return err
	}
	dc := newDialedConn(id)
	conn = dc.c
	if err := conn.Resume(link, func(uint64) (uint64, error) {
		return 0, dialout.WriteWelcome(ctx, ws, dialout.Welcome{ConnID: id})
	}); err != nil {
		conn.End(err)
		return err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.conn = conn
	select {
	case old := <-rt.conns: // never picked up: superseded
		old.c.End(nil)
	default:
	}
	rt.conns <- dc
	return nil
}

// connect is the Client's connector: the next logical connection the
// runtime starts.
func (rt *dialedRuntime) connect(o *options) func(ctx context.Context) (*link, error) {
	return func(ctx context.Context) (*link, error) {
		select {
		case dc := <-rt.conns:
			l := newLink(dc, nil, "dialed-in runtime "+rt.id, o.logger)
			l.paused = func() bool { return !dc.c.Attached() }
			return l, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("runtime %s has not dialed in again: %w", rt.id, context.Cause(ctx))
		}
	}
}

// openStream opens a stream on the runtime's current WebSocket.
func (rt *dialedRuntime) openStream() (net.Conn, error) {
	rt.mu.Lock()
	conn := rt.conn
	rt.mu.Unlock()
	var link *dialout.Link
	if conn != nil {
		link = conn.Link()
	}
	if link == nil {
		return nil, unavailable(nil, "runtime %s is not connected right now", rt.id)
	}
	return link.Mux().Open()
}

// end ends the runtime's logical connection: its Client is gone.
func (rt *dialedRuntime) end() {
	rt.mu.Lock()
	conn := rt.conn
	rt.mu.Unlock()
	if conn != nil {
		conn.End(nil)
	}
}

func newConnID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}
