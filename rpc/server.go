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
)

// Transports, as reported in Request.Transport.
const (
	TransportStdio     = "stdio"
	TransportWebSocket = "websocket"
)

// Request is one call as a Handler sees it.
type Request struct {
	Method string
	// ID is the caller's id as the codec decoded it (for JSON-RPC the raw
	// JSON, echoed back verbatim); nil for a notification.
	ID     json.RawMessage
	Params json.RawMessage
	// Meta is the tenant context, nil when the request carried none.
	Meta      *Meta
	Notif     bool
	Transport string
	// inFrame: ID and Params reference the frame they were decoded from,
	// which the next read reuses (see detach).
	inFrame bool
}

// detach copies what req references of its frame, for a request whose
// handler runs on past the next read.
func (r *Request) detach() {
	if !r.inFrame {
		return
	}
	keep := make([]byte, 0, len(r.ID)+len(r.Params))
	keep = append(append(keep, r.ID...), r.Params...)
	if r.ID != nil {
		r.ID = keep[:len(r.ID):len(r.ID)]
	}
	if r.Params != nil {
		r.Params = keep[len(r.ID):]
	}
	r.inFrame = false
}

// Handler serves requests. It returns the result already encoded as JSON
// (nil means {}), so the server splices it into the answer without
// encoding it again; a returned error goes through the Server's
// ErrorEncoder. The context carries the connection (Notify,
// TransportFrom) and the tenant context (MetaFrom), and is cancelled when
// the connection ends.
type Handler interface {
	Handle(ctx context.Context, req *Request) (json.RawMessage, error)
}

// Call describes a finished request, for logs and metrics.
type Call struct {
	Method    string
	ID        json.RawMessage
	Params    json.RawMessage
	Transport string
	Duration  time.Duration
	// Waited is how long the request waited in the connection's queue
	// before it ran.
	Waited time.Duration
	// Err is the encoded error, nil on success.
	Err *Error
}

// Server serves JSON-RPC connections on any number of transports.
type Server struct {
	handler     Handler
	encoder     ErrorEncoder
	log         zerolog.Logger
	maxInFlight int
	maxPerKey   int
	maxQueued   int
	// maxQueuedBytes bounds the params of the waiting requests.
	maxQueuedBytes int
	queueKey       func(*Request) string
	pingInterval   time.Duration
	pingTimeout    time.Duration
	observe        func(Call)
	inline         map[string]bool
	newCodec       func() Codec

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

// WithMaxInFlight sets how many requests of one connection run at once.
func WithMaxInFlight(n int) Option { return func(s *Server) { s.maxInFlight = n } }

// WithQueueBounds sets how many requests of one key run at once, and how
// many requests (and bytes of params) may wait on one connection.
func WithQueueBounds(perKey, queued, queuedBytes int) Option {
	return func(s *Server) { s.maxPerKey, s.maxQueued, s.maxQueuedBytes = perKey, queued, queuedBytes }
}

// WithQueueKey names what a request's fair share is counted by (its
// session): requests of one key run at most WithQueueBounds' perKey at
// once, and waiting keys take turns. key reads the request before it
// runs, so must be quick; "" is the key of requests that name none.
func WithQueueKey(key func(*Request) string) Option { return func(s *Server) { s.queueKey = key } }

// WithKeepalive sets how often idle WebSocket peers are pinged and how long
// a pong may take before the peer is declared dead.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(s *Server) { s.pingInterval, s.pingTimeout = interval, timeout }
}

// WithInline names methods that never block and are answered on the
// reading goroutine, saving a goroutine handoff per call (the heartbeat).
// Their requests are not copied out of the read buffer, and the request
// and its context are reused by the next one, so such a method must not
// keep its request, id, params or context after it returns.
func WithInline(methods ...string) Option {
	return func(s *Server) {
		for _, m := range methods {
			s.inline[m] = true
		}
	}
}

// WithCodec sets the envelope; newCodec is called once per connection.
// The default is JSON-RPC 2.0.
func WithCodec(newCodec func() Codec) Option { return func(s *Server) { s.newCodec = newCodec } }

// WithObserver is called after every answered request.
func WithObserver(f func(Call)) Option { return func(s *Server) { s.observe = f } }

// NewServer returns a Server for h.
func NewServer(h Handler, opts ...Option) *Server {
	s := &Server{
		handler:        h,
		log:            zerolog.Nop(),
		maxInFlight:    DefaultMaxInFlight,
		maxPerKey:      DefaultMaxPerKey,
		maxQueued:      DefaultMaxQueued,
		maxQueuedBytes: DefaultMaxQueuedBytes,
		pingInterval:   20 * time.Second,
		pingTimeout:    10 * time.Second,
		sockets:        map[*websocket.Conn]struct{}{},
		inline:         map[string]bool{},
		newCodec:       func() Codec { return JSONRPC{} },
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// ServeStdio serves one connection on r/w (one JSON object per line) until
// r reaches EOF or ctx ends.
func (s *Server) ServeStdio(ctx context.Context, r io.Reader, w io.Writer) {
	s.serve(ctx, newLineConn(r, w, MaxMessageBytes, nil), TransportStdio)
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
	s.serve(ctx, &wsConn{ctx: ctx, c: c}, TransportWebSocket)
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
