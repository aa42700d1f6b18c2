package rpc

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"
	"github.com/sourcegraph/jsonrpc2"
)

// Transports, as reported in Request.Transport.
const (
	TransportStdio     = "stdio"
	TransportWebSocket = "websocket"
)

// DefaultMaxInFlight is the per-connection limit of concurrent requests.
const DefaultMaxInFlight = 128

// Request is one call as a Handler sees it.
type Request struct {
	Method string
	// ID is the caller's id as sent (JSON), for logs.
	ID        json.RawMessage
	Params    json.RawMessage
	Meta      json.RawMessage
	Notif     bool
	Transport string
}

// Handler serves requests. The returned result is JSON-encoded; a returned
// error goes through the Server's ErrorEncoder.
type Handler interface {
	Handle(ctx context.Context, req *Request) (any, error)
}

// Call describes a finished request, for logs and metrics.
type Call struct {
	Method    string
	ID        json.RawMessage
	Params    json.RawMessage
	Transport string
	Duration  time.Duration
	// Err is the encoded error, nil on success.
	Err *Error
}

// Server serves JSON-RPC connections on any number of transports.
type Server struct {
	handler      Handler
	encoder      ErrorEncoder
	log          zerolog.Logger
	maxInFlight  int
	pingInterval time.Duration
	pingTimeout  time.Duration
	observe      func(Call)
	inline       map[string]bool

	mu      sync.Mutex
	closed  bool
	sockets map[*websocket.Conn]struct{}
	conns   sync.WaitGroup
}

// Option configures a Server.
type Option func(*Server)

// WithErrorEncoder sets how handler errors are encoded.
func WithErrorEncoder(e ErrorEncoder) Option { return func(s *Server) { s.encoder = e } }

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) Option { return func(s *Server) { s.log = l } }

// WithMaxInFlight sets the per-connection concurrency limit.
func WithMaxInFlight(n int) Option { return func(s *Server) { s.maxInFlight = n } }

// WithKeepalive sets how often idle WebSocket peers are pinged and how long
// a pong may take before the peer is declared dead.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(s *Server) { s.pingInterval, s.pingTimeout = interval, timeout }
}

// WithInline names methods that never block and are answered on the
// reading goroutine, saving a goroutine handoff per call (the heartbeat).
func WithInline(methods ...string) Option {
	return func(s *Server) {
		for _, m := range methods {
			s.inline[m] = true
		}
	}
}

// WithObserver is called after every answered request.
func WithObserver(f func(Call)) Option { return func(s *Server) { s.observe = f } }

// NewServer returns a Server for h.
func NewServer(h Handler, opts ...Option) *Server {
	s := &Server{
		handler:      h,
		log:          zerolog.Nop(),
		maxInFlight:  DefaultMaxInFlight,
		pingInterval: 20 * time.Second,
		pingTimeout:  10 * time.Second,
		sockets:      map[*websocket.Conn]struct{}{},
		inline:       map[string]bool{},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// ServeStdio serves one connection on r/w (one JSON object per line) until
// r reaches EOF or ctx ends.
func (s *Server) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) {
	fc := newLineConn(r, w, MaxMessageBytes, nil)
	s.serve(ctx, newServerStream(fc, s.log, s.encoder), TransportStdio)
}

// ServeHTTP upgrades to a WebSocket and serves one JSON-RPC connection on
// it. Authentication is the caller's job (see RequireToken).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: AcceptedSubprotocols(r)})
	if err != nil {
		s.log.Debug().Err(err).Msg("websocket upgrade failed")
		return
	}
	if !s.track(c) {
		_ = c.Close(websocket.StatusGoingAway, "boxrt shutting down")
		return
	}
	defer s.untrack(c)
	c.SetReadLimit(MaxMessageBytes)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Keepalive(ctx, c, s.pingInterval, s.pingTimeout, s.log)
	s.serve(ctx, newServerStream(&wsConn{ctx: ctx, c: c}, s.log, s.encoder), TransportWebSocket)
}

// Keepalive pings c every interval until ctx ends; a peer that does not
// answer within timeout is closed so its resources are released.
func Keepalive(ctx context.Context, c *websocket.Conn, interval, timeout time.Duration, log zerolog.Logger) {
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, timeout)
			err := c.Ping(pctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					log.Info().Err(err).Msg("websocket peer did not answer a ping; closing")
					_ = c.Close(websocket.StatusPolicyViolation, "keepalive ping timed out")
				}
				return
			}
		}
	}
}

func (s *Server) track(c *websocket.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.sockets[c] = struct{}{}
	s.conns.Add(1)
	return true
}

func (s *Server) untrack(c *websocket.Conn) {
	s.mu.Lock()
	delete(s.sockets, c)
	s.mu.Unlock()
	s.conns.Done()
}

// Close refuses new WebSocket connections, closes the open ones with 1001
// and waits until their handlers have returned or ctx ends.
func (s *Server) Close(ctx context.Context) {
	s.mu.Lock()
	s.closed = true
	for c := range s.sockets {
		go c.Close(websocket.StatusGoingAway, "boxrt shutting down")
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.conns.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

func (s *Server) serve(ctx context.Context, stream *serverStream, transport string) {
	ctx, cancel := context.WithCancel(ctx)
	a := &adapter{server: s, stream: stream, transport: transport, sem: make(chan struct{}, s.maxInFlight)}
	conn := jsonrpc2.NewConn(ctx, stream, a, jsonrpc2.SetLogger(printfLogger{s.log}))
	select {
	case <-conn.DisconnectNotify():
	case <-ctx.Done():
	}
	// In-flight handlers of a dead connection are cancelled, as in the
	// reference; sessions and managed processes do not depend on it.
	cancel()
	_ = conn.Close()
	// Handlers see their context cancelled and their replies refused; one
	// stuck writing to a peer that stopped reading must not hold shutdown.
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(handlerDrainTimeout):
		s.log.Warn().Msg("request handlers still running after the connection ended; not waiting for them")
	}
}

// handlerDrainTimeout bounds how long a closed connection waits for its
// in-flight handlers.
const handlerDrainTimeout = 3 * time.Second

// adapter bridges jsonrpc2 to Handler: one goroutine per request, bounded.
type adapter struct {
	server    *Server
	stream    *serverStream
	transport string
	sem       chan struct{}
	wg        sync.WaitGroup
}

func (a *adapter) Handle(ctx context.Context, conn *jsonrpc2.Conn, r *jsonrpc2.Request) {
	req := &Request{Method: r.Method, Notif: r.Notif, Transport: a.transport}
	if r.Params != nil {
		req.Params = *r.Params
	}
	if r.Meta != nil {
		req.Meta = *r.Meta
	}
	if !r.Notif {
		req.ID = a.stream.peekID(r.ID.Num)
	}
	if a.server.inline[req.Method] {
		start := time.Now()
		result, err := a.server.handler.Handle(ctx, req)
		if !r.Notif {
			a.reply(ctx, conn, r, req, start, result, err)
		}
		return
	}
	select {
	case a.sem <- struct{}{}:
	default:
		if !r.Notif {
			a.reply(ctx, conn, r, req, time.Now(), nil, ErrBusy)
		}
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() { <-a.sem }()
		start := time.Now()
		result, err := a.server.handler.Handle(ctx, req)
		if r.Notif {
			return
		}
		a.reply(ctx, conn, r, req, start, result, err)
	}()
}

func (a *adapter) reply(ctx context.Context, conn *jsonrpc2.Conn, r *jsonrpc2.Request, req *Request, start time.Time, result any, err error) {
	call := Call{Method: req.Method, ID: req.ID, Params: req.Params, Transport: a.transport}
	var sendErr error
	if err != nil {
		call.Err = Encode(a.server.encoder, err)
		sendErr = conn.ReplyWithError(ctx, r.ID, call.Err.jsonrpc())
	} else {
		if result == nil {
			result = struct{}{}
		}
		sendErr = conn.Reply(ctx, r.ID, result)
	}
	call.Duration = time.Since(start)
	if sendErr != nil {
		a.server.log.Debug().Err(sendErr).Str("method", req.Method).Msg("cannot send response")
	}
	if a.server.observe != nil {
		a.server.observe(call)
	}
}

// peekID returns the caller's original id for an internal one without
// forgetting it (the response write does that).
func (s *serverStream) peekID(internal uint64) json.RawMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[internal]
}

type printfLogger struct{ log zerolog.Logger }

func (p printfLogger) Printf(format string, v ...any) { p.log.Debug().Msgf(format, v...) }
