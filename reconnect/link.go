package reconnect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sourcegraph/jsonrpc2"
)

// link is one connection to a runtime: a jsonrpc2.Conn over a child's pipes
// or over a WebSocket. A link never comes back once down; the Client
// replaces it.
type link struct {
	conn  *jsonrpc2.Conn
	child *child // nil in dial mode
	desc  string
	log   *slog.Logger

	// wsem admits one writer at a time and lets the others give up when
	// their context ends: behind a write blocked on a wedged peer, even
	// the heartbeat's ping must still be able to time out. The holder sets
	// wctx, the context of the call being written, for the stream
	// (jsonrpc2 does not pass it down).
	wsem chan struct{}
	wctx context.Context

	readEnd chan struct{} // closed when reading stopped for good
	readErr error         // why; read after readEnd

	down     chan struct{} // closed when the link is declared dead
	downOnce sync.Once
	cause    error // why; read after down

	// released is closed once the Client stopped handing this link to new
	// calls, which a call that found it already down waits for.
	released chan struct{}

	// onNotify receives the runtime's notifications (set by the Client
	// before the link carries any call that could cause one).
	onNotify atomic.Pointer[func(method string, params json.RawMessage)]
	// onOutput receives the exec output notifications read on the fast
	// path (parseOutputFrame); set with onNotify.
	onOutput atomic.Pointer[func(outputNotice)]

	// paused reports, for a dialed-in runtime's link, that no WebSocket
	// carries it right now (the heartbeat waits); nil otherwise.
	paused func() bool

	wg sync.WaitGroup // watch and reply goroutines
}

// newLink starts JSON-RPC on fc. ch is the child behind it, if any.
func newLink(fc frameConn, ch *child, desc string, log *slog.Logger) *link {
	l := &link{child: ch, desc: desc, log: log, wsem: make(chan struct{}, 1), readEnd: make(chan struct{}), down: make(chan struct{}), released: make(chan struct{})}
	stream := &objectStream{
		fc: fc,
		writeCtx: func() context.Context {
			if l.wctx != nil {
				return l.wctx
			}
			return context.Background()
		},
		onWriteError: func(err error) { l.kill(fmt.Errorf("writing to %s failed: %w", desc, err)) },
		onReadEnd: func(err error) {
			l.readErr = err
			close(l.readEnd)
		},
		logger: log,
		onOutput: func(n outputNotice) {
			if fn := l.onOutput.Load(); fn != nil {
				(*fn)(n)
			}
		},
	}
	l.conn = jsonrpc2.NewConn(context.Background(), stream, refuseRequests{l}, jsonrpc2.SetLogger(slogPrintf{log}))
	l.wg.Add(1)
	go l.watch()
	return l
}

// watch declares the link dead when the transport ends: the stream closed
// (EOF, socket error, protocol violation) or the child exited.
func (l *link) watch() {
	defer l.wg.Done()
	var exited <-chan struct{}
	if l.child != nil {
		exited = l.child.exited
	}
	select {
	case <-l.conn.DisconnectNotify():
		if exited != nil {
			// EOF on stdout usually means the child is exiting; wait a
			// moment so the error can say how it ended.
			t := time.NewTimer(250 * time.Millisecond)
			select {
			case <-exited:
			case <-t.C:
			}
			t.Stop()
		}
	case <-exited:
	case <-l.down:
	}
	l.kill(l.deathCause())
}

func (l *link) deathCause() error {
	if l.child != nil && l.child.hasExited() {
		return errors.New(l.child.exitDescription("", false))
	}
	select {
	case <-l.readEnd:
		if errors.Is(l.readErr, io.EOF) {
			return fmt.Errorf("%s closed the connection", l.desc)
		}
		return fmt.Errorf("reading from %s failed: %w", l.desc, l.readErr)
	default:
		return fmt.Errorf("connection to %s closed", l.desc)
	}
}

// kill declares the link dead with cause (the first cause wins) and closes
// the connection, which fails every call still waiting on it.
func (l *link) kill(cause error) {
	l.downOnce.Do(func() {
		l.cause = cause
		close(l.down)
	})
	_ = l.conn.Close()
}

func (l *link) isDown() bool {
	select {
	case <-l.down:
		return true
	default:
		return false
	}
}

// shutdown kills the link, stops and reaps its child and waits for its
// goroutines. graceful lets the child shut down on stdin EOF first.
func (l *link) shutdown(cause error, graceful bool, stopTimeout time.Duration) {
	l.kill(cause)
	if l.child != nil {
		l.child.stop(graceful, stopTimeout)
	}
	<-l.readEnd
	l.wg.Wait()
}

// Call implements Caller on this link alone (the OnConnect hook's view).
func (l *link) Call(ctx context.Context, method string, params, result any) error {
	return l.call(ctx, method, params, result)
}

func (l *link) call(ctx context.Context, method string, params, result any, opts ...jsonrpc2.CallOption) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", method, context.Cause(ctx))
	}
	select {
	case l.wsem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%s: waiting to send: %w", method, context.Cause(ctx))
	case <-l.down:
		return l.lost(ctx, method)
	}
	l.wctx = ctx
	w, err := l.conn.DispatchCall(ctx, method, params, opts...)
	l.wctx = nil
	<-l.wsem
	if err != nil {
		var aborted *errWriteAborted
		switch {
		case errors.As(err, &aborted):
			return fmt.Errorf("%s: %w", method, aborted.err)
		case errors.Is(err, jsonrpc2.ErrClosed):
			return l.lost(ctx, method)
		}
		return fmt.Errorf("reconnect: %s: %w", method, err)
	}
	var raw json.RawMessage
	err = w.Wait(ctx, &raw)
	var we *jsonrpc2.Error
	switch {
	case err == nil:
		if result != nil {
			if err := json.Unmarshal(raw, result); err != nil {
				return fmt.Errorf("reconnect: decoding the result of %s: %w", method, err)
			}
		}
		return nil
	case errors.As(err, &we):
		return fromWire(we)
	case errors.Is(err, jsonrpc2.ErrClosed):
		return l.lost(ctx, method)
	case ctx.Err() != nil:
		// The runtime was reachable but did not answer in time; it may
		// still be working on the request.
		return fmt.Errorf("%s: no answer before the context ended: %w", method, context.Cause(ctx))
	}
	return fmt.Errorf("reconnect: %s: %w", method, err)
}

// lost is the error for a call whose link died under it: a retryable
// BoxRuntimeUnavailableError carrying the reason, or ErrClosed when the
// host closed the client.
func (l *link) lost(ctx context.Context, method string) error {
	select {
	case <-l.down:
	case <-ctx.Done():
		return unavailable(context.Cause(ctx), "%s: the link to boxrt was lost", method)
	}
	if errors.Is(l.cause, ErrClosed) {
		return ErrClosed
	}
	return unavailable(l.cause, "%s: the link to boxrt was lost: %v", method, l.cause)
}

// refuseRequests answers requests from the runtime, which boxrt never
// sends, with "method not found", as JSON-RPC requires of a peer.
type refuseRequests struct{ l *link }

// Notifications (exec output, file events) go to the Client, in order, on
// the reading goroutine.
func (h refuseRequests) Handle(_ context.Context, conn *jsonrpc2.Conn, req *jsonrpc2.Request) {
	if req.Notif {
		if fn := h.l.onNotify.Load(); fn != nil && req.Params != nil {
			(*fn)(req.Method, *req.Params)
		}
		return
	}
	// Not on the reader goroutine: a write blocked on a full pipe would
	// stop the reading that could drain the peer.
	h.l.wg.Add(1)
	go func() {
		defer h.l.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		select {
		case h.l.wsem <- struct{}{}:
		case <-ctx.Done():
			return
		case <-h.l.down:
			return
		}
		h.l.wctx = ctx
		_ = conn.ReplyWithError(ctx, req.ID, &jsonrpc2.Error{Code: ErrMethodNotFound.Code, Message: "MethodNotFound: the host serves no methods"})
		h.l.wctx = nil
		<-h.l.wsem
	}()
}

// slogPrintf routes jsonrpc2's log lines (protocol errors, unmatched
// responses) to the client's logger instead of the standard logger.
type slogPrintf struct{ log *slog.Logger }

func (s slogPrintf) Printf(format string, v ...any) { s.log.Debug(fmt.Sprintf(format, v...)) }
