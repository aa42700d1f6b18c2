package reconnect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// Client is a self-healing JSON-RPC connection to boxrt. It is safe for
// concurrent use. Create it with Spawn or Dial; Close it when done.
//
// Link lifecycle: a supervising goroutine owns the link. It pings it
// (WithHeartbeat), replaces it when it dies (the child exited, the socket
// closed, or too many pings went unanswered), runs the OnConnect hook on
// every new link before any queued call is released, and waits between
// failed attempts per the backoff (WithBackoff, WithJitter).
//
// Backoff rule: after k consecutive failed attempts the next one waits
// base(k) = min(initial × 2^(k-1), max), jittered. A link that dies is
// replaced at once if it had been up for at least the initial backoff
// (3 s); a link that died sooner counts as a failed attempt. Either way no
// more than one attempt per initial backoff is made on average, so a
// runtime that crashes right after its handshake cannot be respawned in a
// hot loop, while a one-off crash costs only the respawn itself.
type Client struct {
	o       options
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	done    chan struct{} // closed when the supervisor has stopped everything
	first   chan error    // outcome of the first connection, sent once
	ownHTTP *http.Client  // the default handshake client, if we made it

	streams streams

	mu       sync.Mutex
	cur      *link         // the link calls use; nil while down
	ready    chan struct{} // closed when cur is set; replaced when it goes
	lastErr  error
	connects int
	closed   bool

	// runtimeID names a runtime that dialed in (Listener); "" otherwise.
	runtimeID string
}

// Status is a snapshot of a Client's link.
type Status struct {
	// Connected reports whether a link is up and past its OnConnect hook.
	Connected bool
	// Connects counts successful (re)connections, the first included.
	Connects int
	// PID is the current child's process id (spawn mode, while connected).
	PID int
	// LastError says why the last link died or the last attempt failed.
	LastError error
}

// Spawn starts a runtime child process (WithCommand, default
// "boxrt serve --stdio") and talks JSON-RPC over its stdin/stdout; its
// stderr goes to WithStderr (default os.Stderr). The child keeps its state
// in a private temporary directory unless told otherwise (WithStateDir).
// It returns once the first link is up and the OnConnect hook succeeded.
// Transient failures are retried with backoff until ctx ends; a command
// that cannot be started at all, a child that exits with status 1 or 2
// before it answers (boxrt's start-up errors: an unknown flag, a refused
// configuration, its port in use, its state directory held by another
// runtime; the error ends with the child's stderr), or a non-retryable
// error from the hook fails at once. ctx only
// bounds this first connection, not the Client's life. Failures are a
// BoxRuntimeUnavailableError (*Error) wrapping the cause; Retryable says
// whether trying again later can help.
func Spawn(ctx context.Context, opts ...Option) (*Client, error) {
	o := buildOptions(opts)
	if len(o.command) == 0 || o.command[0] == "" {
		return nil, errors.New("reconnect: WithCommand: empty command")
	}
	if o.connector == nil {
		if err := chooseStateDir(&o); err != nil {
			return nil, err
		}
		oo := &o
		o.connector = func(context.Context) (*link, error) {
			ch, stdin, stdout, err := startChild(oo)
			if err != nil {
				return nil, err
			}
			return newLink(newLineConn(stdout, stdin), ch, fmt.Sprintf("boxrt (pid %d)", ch.pid()), oo.logger), nil
		}
	}
	return start(ctx, o)
}

// Dial connects to a runtime's WebSocket endpoint. runtimeURL may use ws,
// wss, http (→ ws) or https (→ wss); a missing scheme means ws and a
// missing path means /rpc/ws, so "http://127.0.0.1:5410" works. The token
// (WithToken, else the one DiscoverToken finds) travels only in the
// Authorization header; URLs carrying credentials are refused. Dial returns
// once the first link is up, like Spawn; a refused or missing token (HTTP
// 401/403) fails at once.
func Dial(ctx context.Context, runtimeURL string, opts ...Option) (*Client, error) {
	u, err := normalizeURL(runtimeURL)
	if err != nil {
		return nil, err
	}
	o := buildOptions(opts)
	o.httpBase = httpBase(u)
	if o.tokenSet {
		o.noToken = "WithToken gave an empty one"
	} else {
		tok, looked, err := discoverToken(u, o.stateDir)
		if err != nil {
			return nil, fmt.Errorf("%w (use WithToken or BOXRT_CONTROL_TOKEN)", err)
		}
		o.token, o.noToken = tok, "none found in "+looked
	}
	var own *http.Client
	if o.connector == nil {
		hc := o.httpClient
		if hc == nil {
			own = defaultHTTPClient()
			hc = own
		}
		oo := &o
		o.connector = func(ctx context.Context) (*link, error) { return dialLink(ctx, u, hc, oo) }
	}
	return startWith(ctx, o, own)
}

func buildOptions(opts []Option) options {
	o := defaultOptions()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

func start(ctx context.Context, o options) (*Client, error) { return startWith(ctx, o, nil) }

func startWith(ctx context.Context, o options, own *http.Client) (*Client, error) {
	c := newClient(o)
	c.ownHTTP = own
	go c.run()
	select {
	case err := <-c.first:
		if err != nil {
			_ = c.Close()
			return nil, connectError(err)
		}
		return c, nil
	case <-ctx.Done():
		last := c.Status().LastError
		_ = c.Close()
		if last == nil {
			return nil, connectError(context.Cause(ctx))
		}
		// Both stay reachable: the context's error and the last failure.
		return nil, connectError(fmt.Errorf("%w (last attempt: %w)", context.Cause(ctx), last))
	}
}

func newClient(o options) *Client {
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{o: o, ctx: ctx, cancel: cancel, done: make(chan struct{}), first: make(chan error, 1), ready: make(chan struct{})}
}

// Call sends one request and decodes the result into result (if non-nil).
// While the link is down the call waits for it to come back, or until ctx
// ends (then: a retryable ErrRuntimeUnavailable that also matches ctx's
// error). If the link dies while the call is in flight, the call fails at
// once with a retryable ErrRuntimeUnavailable; it is not retried, since
// the request may have run. Errors from boxrt are *Error values.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	l, err := c.await(ctx, method)
	if err != nil {
		return err
	}
	return l.call(ctx, method, params, result)
}

// await returns the live link, waiting for one while the link is down.
func (c *Client) await(ctx context.Context, method string) (*link, error) {
	for {
		c.mu.Lock()
		closed, l, ready, last := c.closed, c.cur, c.ready, c.lastErr
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		wait := ready
		if l != nil {
			if !l.isDown() {
				return l, nil
			}
			// Down but not yet withdrawn by the supervisor: that takes
			// microseconds; wait for it rather than spin.
			wait = l.released
		}
		select {
		case <-wait:
		case <-c.ctx.Done():
			return nil, ErrClosed
		case <-ctx.Done():
			if last == nil {
				last = errors.New("reconnecting")
			}
			return nil, unavailable(context.Cause(ctx), "%s: boxrt is unavailable (%v) and did not come back before the call's context ended", method, last)
		}
	}
}

// Status reports the link's state.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Status{Connected: c.cur != nil && !c.cur.isDown(), Connects: c.connects, LastError: c.lastErr}
	if s.Connected && c.cur.child != nil {
		s.PID = c.cur.child.pid()
	}
	return s
}

// Close stops the heartbeat and any reconnect, fails waiting calls with
// ErrClosed, closes the link and, in spawn mode, stops the child (stdin
// EOF for boxrt's graceful shutdown, then SIGTERM, then SIGKILL, each
// after WithStopTimeout) and reaps it. When Close returns no goroutine,
// process or socket of the Client remains. It is safe to call twice.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	<-c.done
	return nil
}

// run is the supervisor: connect, serve, replace, until Close.
func (c *Client) run() {
	defer close(c.done)
	defer func() {
		if c.ownHTTP != nil {
			c.ownHTTP.CloseIdleConnections()
		}
		if c.o.cleanup != nil {
			// Every child has been reaped: nothing uses the directory.
			c.o.cleanup()
		}
		c.notify(StateClosed, nil)
	}()
	firstPending := true
	failures := 0
	for {
		if failures > 0 {
			d := backoffDelay(failures, c.o.backoffInitial, c.o.backoffMax, c.o.jitter, 2*c.o.rand()-1)
			c.o.logger.Info("boxrt: waiting before reconnecting", "delay", d, "failures", failures)
			t := c.o.clock.NewTimer(d)
			select {
			case <-t.C():
			case <-c.ctx.Done():
				t.Stop()
				return
			}
		}
		l, err := c.connect()
		if c.ctx.Err() != nil {
			if l != nil {
				l.shutdown(ErrClosed, true, c.o.stopTimeout)
			}
			return
		}
		if err != nil {
			c.setLastErr(err)
			c.o.logger.Warn("boxrt: connection attempt failed", "err", err)
			c.notify(StateConnectFailed, err)
			if firstPending && isPermanent(err) {
				c.first <- err
				return
			}
			failures++
			continue
		}

		up := c.o.clock.Now()
		c.publish(l)
		c.o.logger.Info("boxrt: connected", "link", l.desc)
		c.notify(StateConnected, nil)
		if firstPending {
			firstPending = false
			c.first <- nil
		}

		cause := c.serve(l)
		c.withdraw(l, cause)
		if c.ctx.Err() != nil {
			l.shutdown(ErrClosed, true, c.o.stopTimeout)
			return
		}
		c.o.logger.Warn("boxrt: link lost", "link", l.desc, "err", cause)
		c.notify(StateDisconnected, cause)
		l.shutdown(cause, false, c.o.stopTimeout)
		if c.o.clock.Now().Sub(up) >= c.o.backoffInitial {
			failures = 0
		} else {
			failures++
		}
	}
}

// connect makes one attempt: transport, __ping, OnConnect.
func (c *Client) connect() (*link, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.o.connectTimeout)
	defer cancel()
	l, err := c.o.connector(ctx)
	if err != nil {
		return nil, err
	}
	notify, output := c.notified, c.outputNotified
	l.onNotify.Store(&notify)
	l.onOutput.Store(&output)
	answered := false
	fail := func(step string, err error) (*link, error) {
		if l.child != nil && l.child.waitExit(100*time.Millisecond) {
			// The child died during the handshake; its exit status and
			// the end of its stderr say why, better than "link lost".
			l.shutdown(err, false, c.o.stopTimeout)
			exit := errors.New(l.child.exitDescription(step, true))
			if !answered && l.child.exitedAtStart() {
				return nil, permanent(exit)
			}
			return nil, exit
		}
		l.shutdown(fmt.Errorf("%s failed: %w", step, err), false, c.o.stopTimeout)
		return nil, fmt.Errorf("%s: %s: %w", l.desc, step, err)
	}
	if err := l.call(ctx, "__ping", struct{}{}, nil); err != nil {
		return fail("handshake __ping", err)
	}
	answered = true
	if c.o.onConnect != nil {
		if err := c.o.onConnect(ctx, l); err != nil {
			return fail("OnConnect hook", err)
		}
	}
	if l.isDown() {
		return fail("handshake", fmt.Errorf("link lost right after the handshake: %w", l.cause))
	}
	return l, nil
}

// serve watches a published link until it dies, the heartbeat gives up on
// it, or the client closes; it returns why.
func (c *Client) serve(l *link) error {
	hbErr := make(chan error, 1)
	hctx, stop := context.WithCancel(c.ctx)
	var wg sync.WaitGroup
	if c.o.hbInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.heartbeat(hctx, l); err != nil {
				hbErr <- err
			}
		}()
	}
	defer func() {
		stop()
		wg.Wait()
	}()
	select {
	case <-l.down:
		return l.cause
	case err := <-hbErr:
		l.kill(err)
		return err
	case <-c.ctx.Done():
		return ErrClosed
	}
}

func (c *Client) publish(l *link) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = l
	c.connects++
	c.lastErr = nil
	close(c.ready)
}

func (c *Client) withdraw(l *link, cause error) {
	c.mu.Lock()
	if c.cur == l {
		c.cur = nil
		c.ready = make(chan struct{})
	}
	c.lastErr = cause
	close(l.released)
	c.mu.Unlock()
	c.streams.lost(l, cause)
}

// notified handles a notification from boxrt: exec output goes to its
// CallStream, everything goes to WithOnNotification.
func (c *Client) notified(method string, params json.RawMessage) {
	if method == OutputNotification {
		c.streams.deliver(params)
	}
	if c.o.onNotification != nil {
		c.o.onNotification(method, params)
	}
}

// outputNotified is notified for an exec output notification already
// decoded (parseOutputFrame).
func (c *Client) outputNotified(n outputNotice) {
	if n.ours {
		c.streams.route(n.requestID, n.out)
	}
	if c.o.onNotification != nil {
		// n.params is in the read buffer, which the next frame reuses.
		c.o.onNotification(OutputNotification, bytes.Clone(n.params))
	}
}

func (c *Client) setLastErr(err error) {
	c.mu.Lock()
	c.lastErr = err
	c.mu.Unlock()
}

func (c *Client) notify(s State, err error) {
	if c.o.onStateChange != nil {
		c.o.onStateChange(s, err)
	}
}

// errPingTimeout is the cancel cause of a ping that was not answered.
var errPingTimeout = errors.New("no answer")

// heartbeat pings l every interval (paced from the start of the previous
// ping) and returns an error once failures pings in a row went unanswered.
func (c *Client) heartbeat(ctx context.Context, l *link) error {
	clk := c.o.clock
	timeout := c.o.hbTimeout
	if timeout <= 0 {
		timeout = c.o.hbInterval
	}
	wait := c.o.hbInterval
	failed := 0
	for {
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		if l.paused != nil && l.paused() {
			// A dialed-in runtime between WebSockets: its logical
			// connection waits for it to dial again, and unanswered
			// pings would only end what is meant to resume.
			failed, wait = 0, c.o.hbInterval
			continue
		}
		started := clk.Now()
		pctx, cancel := context.WithCancelCause(ctx)
		pt := clk.AfterFunc(timeout, func() { cancel(errPingTimeout) })
		err := l.call(pctx, "__ping", struct{}{}, nil)
		pt.Stop()
		timedOut := errors.Is(context.Cause(pctx), errPingTimeout)
		cancel(nil)
		if ctx.Err() != nil {
			return nil
		}
		var we *Error
		if err == nil || (errors.As(err, &we) && we.cause == nil) {
			// Answered, even if with an error: the link works.
			failed = 0
		} else {
			failed++
			if timedOut {
				err = fmt.Errorf("__ping: no answer within %v", timeout)
			}
			c.o.logger.Warn("boxrt: heartbeat failed", "link", l.desc, "failures", failed, "of", c.o.hbFailures, "err", err)
			if failed >= c.o.hbFailures {
				return fmt.Errorf("heartbeat: %d consecutive __ping failures (every %v, timeout %v), last: %w",
					failed, c.o.hbInterval, timeout, err)
			}
		}
		wait = max(c.o.hbInterval-clk.Now().Sub(started), 0)
	}
}
