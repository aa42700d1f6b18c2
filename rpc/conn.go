package rpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
)

// frameConn moves whole messages. ReadFrame returns errFrameTooLarge
// (after discarding the oversized message) when the connection can go on;
// the frame it returns is valid until the next ReadFrame. WriteFrame may
// buffer until Flush, and may use the frame's spare capacity: the frames
// a Codec returns are fresh buffers that only the connection holds.
type frameConn interface {
	ReadFrame() ([]byte, error)
	// More reports whether a whole frame is already buffered, so the next
	// ReadFrame will not block.
	More() bool
	WriteFrame([]byte) error
	Flush() error
	Close() error
}

var errFrameTooLarge = errors.New("message exceeds the size limit")

// ErrClosed is returned by Notify once the connection has ended.
var ErrClosed = errors.New("connection closed")

// drainTimeout bounds how long a connection whose peer stopped sending
// waits for the answers still owed before cancelling them, and then how
// long it waits for the cancelled handlers to return.
const drainTimeout = 3 * time.Second

// conn is one connection's frame loop: read a frame, decode it once,
// dispatch it (inline, or on its own goroutine within the in-flight
// bound), encode the answer once.
type conn struct {
	srv       *Server
	fc        frameConn
	codec     Codec
	transport string
	out       outbox
	sched     *scheduler

	// req is the request being read; an inline call is served from it and
	// from inlineCtx and inlineFrames, so a heartbeat allocates nothing.
	req          Request
	inlineCtx    requestContext
	inlineFrames [][]byte

	mu       sync.Mutex // guards closed against handlers.Add, and inflight
	closed   bool
	handlers sync.WaitGroup
	// inflight cancels a running request by its id ($/cancelRequest).
	inflight map[string]context.CancelFunc
	// life is cancelled when the connection ends (ConnContext).
	life context.Context
}

type connKey struct{}
type requestKey struct{}

// requestContext carries the request its handler serves (RequestIDFrom,
// MetaFrom): context.WithValue, but reusable for inline calls.
type requestContext struct {
	context.Context
	req *Request
}

func (rc *requestContext) Value(key any) any {
	if key == (requestKey{}) {
		return rc.req
	}
	return rc.Context.Value(key)
}

// asyncCall is a request whose handler runs on its own goroutine, copied
// out of the reading goroutine's, with its context and its place in the
// connection's scheduler: one allocation.
type asyncCall struct {
	req  Request
	ctx  requestContext
	done func() // unregisters it from $/cancelRequest
	q    queued
}

// CancelMethod is the notification that cancels an in-flight request, as
// in the Language Server Protocol: params {"id": <the request's id>}. The
// request's context is cancelled; the handler still answers (what a
// cancelled call answers is the method's business). An unknown or
// finished id is ignored.
const CancelMethod = "$/cancelRequest"

func (s *Server) serve(ctx context.Context, fc frameConn, transport string) {
	c := &conn{srv: s, fc: fc, codec: s.newCodec(), transport: transport,
		sched: newScheduler(s.maxInFlight, s.maxPerKey, s.maxQueued, s.maxQueuedBytes)}
	c.out.init(fc, c.codec)
	ctx, cancel := context.WithCancel(context.WithValue(ctx, connKey{}, c))
	defer cancel()
	c.life = ctx
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.readLoop(ctx)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	// In-flight handlers of a dead connection are cancelled, as in the
	// reference; sessions and managed processes do not depend on it.
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	cancel()
	c.dropQueued()
	_ = fc.Close()
	// One handler stuck writing to a peer that stopped reading must not
	// hold shutdown.
	if !waitTimeout(&c.handlers, drainTimeout) {
		s.log.Warn().Msg("request handlers still running after the connection ended; not waiting for them")
	}
	c.out.close()
}

func (c *conn) readLoop(ctx context.Context) {
	c.inlineCtx = requestContext{Context: ctx, req: &c.req}
	for {
		// Answers of inline calls wait in the outbox while more requests
		// are already buffered, so a burst costs one write, not one each.
		if !c.fc.More() {
			if err := c.out.flush(); err != nil {
				c.srv.log.Debug().Err(err).Msg("cannot send responses")
			}
		}
		frame, err := c.fc.ReadFrame()
		if errors.Is(err, errFrameTooLarge) {
			c.srv.log.Warn().Int("limit", MaxMessageBytes).Msg("refused oversized message")
			c.send(Message{Error: invalidRequest("message exceeds the %d-byte limit", MaxMessageBytes)}, false)
			continue
		}
		if err != nil {
			// The peer stopped sending (stdin EOF): answer what is already
			// in flight before the connection is torn down.
			_ = c.out.flush()
			waitTimeout(&c.handlers, drainTimeout)
			return
		}
		if ctx.Err() != nil {
			return
		}
		ok, err := c.codec.Decode(frame, &c.req)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				de = &DecodeError{Err: parseError("%v", err)}
			}
			c.srv.log.Debug().Str("error_type", de.Err.Type).Str("error", de.Err.Message).Msg("rejected malformed message")
			c.send(Message{ID: de.ID, Error: de.Err}, false)
			continue
		}
		if !ok {
			continue
		}
		if c.req.Notif && c.req.Method == CancelMethod {
			c.cancelRequest(c.req.Params)
			continue
		}
		c.req.Transport = c.transport
		c.dispatch(ctx, &c.req)
	}
}

// dispatch runs inline methods on the reading goroutine and everything
// else on its own goroutine, when the scheduler gives it a turn; a request
// the full queue has no room for is refused at once.
func (c *conn) dispatch(ctx context.Context, req *Request) {
	if c.srv.inline[req.Method] {
		c.run(&c.inlineCtx, req, true, 0)
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.handlers.Add(1)
	c.mu.Unlock()
	a := &asyncCall{req: *req, done: func() {}}
	a.q = queued{call: a, size: len(req.Params), at: time.Now()}
	if c.srv.queueKey != nil {
		a.q.key = c.srv.queueKey(req)
	}
	a.req.detach()
	// Registered here, on the reading goroutine, so a $/cancelRequest read
	// right after the request finds it even before it runs; and before
	// the scheduler sees it, since a finishing request may start it at
	// once.
	if !a.req.Notif && a.req.ID != nil {
		ctx, a.done = c.cancellable(ctx, a.req.ID)
	}
	a.ctx = requestContext{Context: ctx, req: &a.req}
	run, ok, retryAfter := c.sched.admit(&a.q)
	switch {
	case run:
		go c.runQueued(a)
	case !ok:
		a.done()
		c.handlers.Done()
		if !a.req.Notif && retryAfter > 0 {
			c.reply(&a.req, a.q.at, 0, nil, queueFull(c.srv.maxQueued, retryAfter), true) // on the reading goroutine
		}
	}
}

// runQueued serves a, then, on the same goroutine, the requests the
// scheduler hands over as each one finishes. A request handed over once
// the connection is ending is dropped unanswered, as dropQueued would.
func (c *conn) runQueued(a *asyncCall) {
	for handedOver := false; a != nil; handedOver = true {
		start := time.Now()
		if !handedOver {
			c.run(&a.ctx, &a.req, false, 0)
		} else if c.life.Err() == nil {
			c.run(&a.ctx, &a.req, false, start.Sub(a.q.at))
		}
		a.done()
		c.handlers.Done()
		next := c.sched.done(a.q.key, time.Since(start))
		a = nil
		if next != nil {
			a = next.call
		}
	}
}

// dropQueued forgets the requests that were waiting when the connection
// ended: they never ran and get no answer, like those cancelled running.
func (c *conn) dropQueued() {
	for _, q := range c.sched.close() {
		q.call.done()
		c.handlers.Done()
	}
}

// run serves req, whose request ctx already carries, after it waited
// its turn for waited; inline: on the reading goroutine.
func (c *conn) run(ctx context.Context, req *Request, inline bool, waited time.Duration) {
	start := time.Now()
	result, err := c.srv.handler.Handle(ctx, req)
	if errors.Is(err, ErrNoReply) {
		c.srv.log.Debug().Str("method", req.Method).Msg("request cancelled without a reply")
		return
	}
	if !req.Notif {
		c.reply(req, start, waited, result, err, inline)
	}
}

// reply answers req. An answer made on the reading goroutine (inline) is
// written at once unless more requests are already buffered (those share
// one write), so it does not wait for the observer (log line, metrics).
func (c *conn) reply(req *Request, start time.Time, waited time.Duration, result json.RawMessage, err error, inline bool) {
	call := Call{Method: req.Method, ID: req.ID, Params: req.Params, Transport: c.transport, Waited: waited}
	m := Message{ID: req.ID, Result: result}
	if err != nil {
		call.Err = Encode(c.srv.encoder, err)
		m.Error = call.Err
	}
	var sendErr error
	if inline {
		// The frames' list is the connection's: the outbox copies it.
		c.inlineFrames, sendErr = c.sendFrames(c.inlineFrames[:0], m, !c.fc.More())
		clear(c.inlineFrames)
	} else {
		_, sendErr = c.sendFrames(nil, m, true)
	}
	if sendErr != nil {
		c.srv.log.Debug().Err(sendErr).Str("method", req.Method).Msg("cannot send response")
	}
	call.Duration = time.Since(start)
	if c.srv.observe != nil {
		c.srv.observe(call)
	}
}

// send encodes m and queues it; an answer that would exceed the message
// limit is replaced by an error saying so.
func (c *conn) send(m Message, flush bool) error {
	_, err := c.sendFrames(nil, m, flush)
	return err
}

// sendFrames is send with the frames' list appended to scratch, which it
// returns for reuse.
func (c *conn) sendFrames(scratch [][]byte, m Message, flush bool) ([][]byte, error) {
	frames, err := c.encode(scratch, m)
	if err != nil {
		return frames, err
	}
	return frames, c.out.send(frames, flush)
}

func (c *conn) encode(scratch [][]byte, m Message) ([][]byte, error) {
	frames, err := c.codec.Encode(scratch, m)
	if err != nil {
		return scratch, err
	}
	for _, f := range frames[len(scratch):] {
		if len(f) > MaxMessageBytes {
			if m.Method != "" {
				return nil, fmt.Errorf("notification %s: %w (%d bytes, limit %d)", m.Method, ErrResponseTooLarge, len(f), MaxMessageBytes)
			}
			c.srv.log.Error().Int("bytes", len(f)).Msg("response exceeds the message limit; sending an error instead")
			e := Encode(c.srv.encoder, fmt.Errorf("%w (%d bytes, limit %d)", ErrResponseTooLarge, len(f), MaxMessageBytes))
			return c.codec.Encode(scratch, Message{ID: m.ID, Error: e})
		}
	}
	return frames, nil
}

// cancellable registers ctx's request for $/cancelRequest until done.
func (c *conn) cancellable(ctx context.Context, id json.RawMessage) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancel(ctx)
	key := idString(id)
	c.mu.Lock()
	if c.inflight == nil {
		c.inflight = map[string]context.CancelFunc{}
	}
	// A client reusing the id of a request still in flight cancels the
	// newer one only: the older one stays reachable by nobody.
	c.inflight[key] = cancel
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		delete(c.inflight, key)
		c.mu.Unlock()
		cancel()
	}
}

// cancelRequest handles $/cancelRequest.
func (c *conn) cancelRequest(params json.RawMessage) {
	var p struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.ID) == 0 {
		c.srv.log.Debug().Msg("ignored " + CancelMethod + " without an id")
		return
	}
	c.mu.Lock()
	cancel := c.inflight[idString(p.ID)]
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// idString is an id's canonical JSON (no insignificant whitespace), so the
// id in $/cancelRequest matches the request's however either was spaced.
func idString(id json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, id) != nil {
		return string(id)
	}
	return b.String()
}

// RequestIDFrom returns the id of the request in ctx (nil for a
// notification or outside a request), e.g. to name the request in the
// notifications it causes.
func RequestIDFrom(ctx context.Context) json.RawMessage {
	if req, ok := ctx.Value(requestKey{}).(*Request); ok && !req.Notif {
		return req.ID
	}
	return nil
}

// Notify sends a server-initiated notification (no id, no answer) on the
// connection the request in ctx arrived on. It only needs ctx's values, so
// a context detached from the request (context.WithoutCancel) keeps
// notifying the connection after the request returned, until the
// connection ends (ErrClosed). It waits while the peer is slow to read.
func Notify(ctx context.Context, method string, params any) error {
	return notify(ctx, method, params, true)
}

// NotifyQueued is Notify for a notification that more will follow at
// once: it is queued, and written together with the next Notify (or
// answer), or alone when the queue is large. A burst of notifications then
// costs one write instead of one each. The caller must end the burst with
// Notify, or the last ones may wait for the next write on the connection.
func NotifyQueued(ctx context.Context, method string, params any) error {
	return notify(ctx, method, params, false)
}

// NotifyJSON is Notify (or, with more, NotifyQueued) with params already
// encoded, which are sent as they are, not checked: for a method that
// encodes a large notification faster itself than encoding/json would
// (streamed exec output). params must be one valid JSON value; it is not
// referenced after NotifyJSON returns, so the caller may reuse it.
func NotifyJSON(ctx context.Context, method string, params json.RawMessage, more bool) error {
	c, ok := ctx.Value(connKey{}).(*conn)
	if !ok {
		return notifyOutside(ctx, method, params)
	}
	return c.send(Message{Method: method, Params: params}, !more)
}

var errNotifyOutside = errors.New("rpc: Notify outside a request")

func notify(ctx context.Context, method string, params any, flush bool) error {
	c, ok := ctx.Value(connKey{}).(*conn)
	_, other := ctx.Value(notifierKey{}).(Notifier)
	if !ok && !other {
		return errNotifyOutside
	}
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	if !ok {
		return notifyOutside(ctx, method, raw)
	}
	return c.send(Message{Method: method, Params: raw}, flush)
}

// A Notifier receives the notifications of a request that a Handler serves
// for something other than a connection of this package (boxrt's MCP
// server calls the catalogue directly). params is not referenced after
// it returns.
type Notifier func(method string, params json.RawMessage) error

type notifierKey struct{}

// WithNotifier returns ctx whose Notify, NotifyQueued and NotifyJSON go to
// n, for a request served outside a connection.
func WithNotifier(ctx context.Context, n Notifier) context.Context {
	return context.WithValue(ctx, notifierKey{}, n)
}

func notifyOutside(ctx context.Context, method string, params json.RawMessage) error {
	if n, ok := ctx.Value(notifierKey{}).(Notifier); ok {
		return n(method, params)
	}
	return errNotifyOutside
}

// ConnContext returns a context that lives as long as the connection the
// request in ctx arrived on, not just as long as the request, and still
// reaches it with Notify: for work a method starts and that keeps notifying
// after its answer (a file watch). Outside a request it returns ctx.
func ConnContext(ctx context.Context) context.Context {
	if c, ok := ctx.Value(connKey{}).(*conn); ok {
		return c.life
	}
	return ctx
}

// TransportFrom returns the transport the request in ctx arrived on
// (TransportStdio, TransportWebSocket), "" outside a request.
func TransportFrom(ctx context.Context) string {
	if c, ok := ctx.Value(connKey{}).(*conn); ok {
		return c.transport
	}
	return ""
}

// MetaFrom returns the tenant context of the request in ctx, if it had
// one.
func MetaFrom(ctx context.Context) (*Meta, bool) {
	if req, ok := ctx.Value(requestKey{}).(*Request); ok && req.Meta != nil {
		return req.Meta, true
	}
	return nil, false
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// maxQueuedBytes bounds the answers waiting for the writer: past it the
// producer waits (backpressure on a peer that does not read) or, on the
// reading goroutine, flushes instead of deferring.
const maxQueuedBytes = 256 << 10

// outbox serialises writes and coalesces them: frames queued while a
// write is in progress go out together in the next one (group commit), so
// concurrent answers share syscalls, yet a lone answer is written at once
// by the goroutine that produced it — no writer goroutine, no handoff.
type outbox struct {
	fc frameConn
	// recycle takes back a written frame (nil: the codec does not).
	recycle func([]byte)

	mu       sync.Mutex
	cond     *sync.Cond // a write round ended
	queue    [][]byte
	spare    [][]byte
	queued   int
	flushing bool
	err      error
}

func (o *outbox) init(fc frameConn, codec Codec) {
	o.fc = fc
	o.cond = sync.NewCond(&o.mu)
	if r, ok := codec.(frameRecycler); ok {
		o.recycle = r.recycle
	}
}

// send queues frames and writes them unless another goroutine is writing
// (it will pick them up) or defer is asked for and the queue is small (the
// reading goroutine flushes before it next blocks).
func (o *outbox) send(frames [][]byte, flush bool) error {
	o.mu.Lock()
	for o.err == nil && o.flushing && o.queued >= maxQueuedBytes {
		o.cond.Wait()
	}
	if o.err != nil {
		err := o.err
		o.mu.Unlock()
		return err
	}
	o.queue = append(o.queue, frames...)
	for _, f := range frames {
		o.queued += len(f)
	}
	if o.flushing || (!flush && o.queued < maxQueuedBytes) {
		o.mu.Unlock()
		return nil
	}
	return o.writeLocked()
}

// flush writes whatever is queued, unless a write is already under way.
func (o *outbox) flush() error {
	o.mu.Lock()
	if o.flushing || len(o.queue) == 0 {
		err := o.err
		o.mu.Unlock()
		return err
	}
	return o.writeLocked()
}

// writeLocked writes rounds until the queue is empty; o.mu is held on
// entry and released on return, and not held during the writes.
func (o *outbox) writeLocked() error {
	o.flushing = true
	for len(o.queue) > 0 && o.err == nil {
		batch := o.queue
		o.queue, o.queued = o.spare[:0], 0
		o.mu.Unlock()
		var err error
		for _, f := range batch {
			if err = o.fc.WriteFrame(f); err != nil {
				break
			}
		}
		if err == nil {
			err = o.fc.Flush()
		}
		if o.recycle != nil {
			for _, f := range batch {
				o.recycle(f)
			}
		}
		clear(batch)
		o.mu.Lock()
		o.spare = batch[:0]
		if err != nil {
			o.err = err
		}
		o.cond.Broadcast()
	}
	o.flushing = false
	err := o.err
	o.mu.Unlock()
	return err
}

// close makes later sends fail with ErrClosed.
func (o *outbox) close() {
	o.mu.Lock()
	if o.err == nil {
		o.err = ErrClosed
	}
	o.cond.Broadcast()
	o.mu.Unlock()
}
