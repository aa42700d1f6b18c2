package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
)

// Close codes the relay uses besides the standard ones.
const (
	// CloseTakenOver: a newer attacher took the process over.
	CloseTakenOver websocket.StatusCode = 4001
	// CloseStdioUnavailable: the process's stdin can no longer be written.
	CloseStdioUnavailable websocket.StatusCode = 4002
)

// Response headers sent with the upgrade, telling the attacher about the
// replayed backlog.
const (
	HeaderReplayLines   = "X-Boxrt-Replay-Lines"
	HeaderReplayDropped = "X-Boxrt-Replay-Dropped"
)

// MaxMessageBytes bounds frames in both directions.
const MaxMessageBytes = 16 << 20

// writeTimeout bounds sending one batch of stdout frames to the attacher.
const writeTimeout = 30 * time.Second

// Event is reported to the observer for metrics.
type Event struct {
	Kind      string // "attach", "in", "out", "replay_dropped", "close"
	SessionID string
	ProcessID string
	Bytes     int
	Count     int // frames for "in" and "out", lines for "replay_dropped"
}

// Handler is the relay's http.Handler.
type Handler struct {
	rt         *runtime.Runtime
	operator   *rpc.Authenticator
	authorizer func(r *http.Request, sessionID, processID string) bool
	scope      Scope
	// maxFrame, when set, is the largest stdout line sent: a longer one
	// closes the relay (1009) instead of reaching a peer that cannot read
	// it.
	maxFrame     int
	log          zerolog.Logger
	observe      func(Event)
	pingInterval time.Duration
	pingTimeout  time.Duration
	// stdinTimeout bounds writing one frame to the process's stdin.
	stdinTimeout time.Duration

	mu     sync.Mutex
	closed bool
	// cut: Close ran out of time, connections are cut rather than closed.
	cut bool
	// bridges stops each attached socket's bridge.
	bridges map[*bridge]context.CancelCauseFunc
	// serving counts the requests in ServeHTTP, so Close can wait until
	// none touches a process any more.
	serving sync.WaitGroup
}

// Why a bridge was stopped from outside its own loops.
var (
	errShuttingDown = errors.New("boxrt shutting down")
	errPeerGone     = errors.New("peer did not answer a keepalive ping")
)

// Option configures a Handler.
type Option func(*Handler)

// WithOperator also lets the control token's holder attach to every
// process; without it only each process's own relay_token opens its relay.
func WithOperator(a *rpc.Authenticator) Option { return func(h *Handler) { h.operator = a } }

// WithAuthorizer admits requests a caller-defined credential vouches for
// (LangBot's X-LangBot-* headers checked against the tenancy fence), in
// addition to the control and relay tokens.
func WithAuthorizer(a func(r *http.Request, sessionID, processID string) bool) Option {
	return func(h *Handler) { h.authorizer = a }
}

// WithScope resolves the session a request names within the placement
// its headers name (see Scope).
func WithScope(s Scope) Option { return func(h *Handler) { h.scope = s } }

// WithMaxFrame closes the relay on a stdout line of n bytes or more: the
// LangBot host's WebSocket client refuses messages of 1 MiB and more.
func WithMaxFrame(n int) Option { return func(h *Handler) { h.maxFrame = n } }

// WithLogger sets the logger.
func WithLogger(l zerolog.Logger) Option { return func(h *Handler) { h.log = l } }

// WithObserver receives relay events.
func WithObserver(f func(Event)) Option { return func(h *Handler) { h.observe = f } }

// WithKeepalive sets the ping interval and pong timeout for idle sockets.
func WithKeepalive(interval, timeout time.Duration) Option {
	return func(h *Handler) { h.pingInterval, h.pingTimeout = interval, timeout }
}

// New returns the relay handler for rt.
func New(rt *runtime.Runtime, opts ...Option) *Handler {
	h := &Handler{rt: rt, log: zerolog.Nop(), observe: func(Event) {}, pingInterval: 20 * time.Second,
		pingTimeout: 10 * time.Second, stdinTimeout: 30 * time.Second, bridges: map[*bridge]context.CancelCauseFunc{}}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Close closes every relay socket with 1001, refuses new ones, and returns
// once every request has ended, so that the runtime can stop the processes
// after it with no bridge still detaching from or writing to them. The
// http.Server does not wait for these: their connections are hijacked.
// When ctx ends first, the connections still open (peers that did not
// answer the close) are cut, which ends their bridges at once; Close then
// returns ctx's error.
func (h *Handler) Close(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	for _, stop := range h.bridges {
		stop(errShuttingDown)
	}
	h.mu.Unlock()
	done := make(chan struct{})
	go func() {
		h.serving.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	h.mu.Lock()
	h.cut = true
	for b := range h.bridges {
		_ = b.conn.Close()
	}
	h.mu.Unlock()
	// Without its connection every step of a bridge ends: socket reads and
	// writes fail, and stdin writes and the keepalive end with its context.
	<-done
	return ctx.Err()
}

// enter counts a request in, unless the handler is closed.
func (h *Handler) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.serving.Add(1)
	return true
}

// track registers b for Close to stop. A request that entered before Close
// but upgraded after it is stopped at once (and cut, if Close already ran
// out of time), ending like the others.
func (h *Handler) track(b *bridge, stop context.CancelCauseFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bridges[b] = stop
	if h.closed {
		stop(errShuttingDown)
	}
	if h.cut {
		_ = b.conn.Close()
	}
}

func (h *Handler) untrack(b *bridge) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.bridges, b)
}

// writeError answers a failed HTTP request (relay or files endpoint) with
// the one status mapping and the JSON error body every route shares.
func writeError(w http.ResponseWriter, err error) {
	rpc.WriteHTTPError(w, boxerr.HTTPStatus(err), boxerr.TypeOf(err), err.Error())
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sessionID := r.PathValue("session_id")
	processID := r.PathValue("process_id")
	if processID == "" {
		processID = runtime.DefaultProcessID
	}
	if !h.enter() {
		writeError(w, boxerr.RuntimeUnavailable("Box runtime is shutting down"))
		return
	}
	defer h.serving.Done()
	ctx, logical, inScope := scoped(h.scope, r, sessionID)
	if !inScope || !h.authorized(ctx, r, sessionID, logical, processID) {
		rpc.WriteUnauthorized(w, r)
		return
	}
	if err := h.rt.Processes().CheckAttach(ctx, logical, processID); err != nil {
		writeError(w, err)
		return
	}
	// Attaching takes the process over from the current attacher: only do
	// it for a real WebSocket upgrade.
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		rpc.WriteHTTPError(w, http.StatusUpgradeRequired, "UpgradeRequired", "this route only serves WebSocket upgrades")
		return
	}
	att, proc, err := h.rt.Processes().Attach(ctx, logical, processID)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set(HeaderReplayLines, strconv.Itoa(len(att.Backlog)))
	w.Header().Set(HeaderReplayDropped, strconv.Itoa(att.Dropped))
	hw := &hijackWriter{ResponseWriter: w}
	c, err := websocket.Accept(hw, r, &websocket.AcceptOptions{Subprotocols: rpc.AcceptedSubprotocols(r)})
	if err != nil {
		att.Detach(att.Backlog...)
		h.log.Debug().Err(err).Msg("relay upgrade failed")
		return
	}
	c.SetReadLimit(MaxMessageBytes)
	log := h.log.With().Str("session_id", sessionID).Str("process_id", processID).Logger()
	log.Info().Int("replay_lines", len(att.Backlog)).Int("replay_dropped", att.Dropped).Msg("relay attached")
	h.observe(Event{Kind: "attach", SessionID: sessionID, ProcessID: processID})
	if att.Dropped > 0 {
		h.observe(Event{Kind: "replay_dropped", SessionID: sessionID, ProcessID: processID, Count: att.Dropped})
	}
	s := &bridge{h: h, c: c, conn: hw.conn, att: att, proc: proc, sessionID: sessionID, processID: processID, log: log}
	s.run()
}

// authorized reports whether r carries the control token (when the
// operator may attach) or the relay token of exactly this session's
// process. An unknown session or process is unauthorized too, so a
// client without a valid credential learns nothing about what exists.
// sessionID is the path's, logical the id ctx's namespace knows it by.
func (h *Handler) authorized(ctx context.Context, r *http.Request, sessionID, logical, processID string) bool {
	if h.operator != nil && h.operator.Check(r) {
		return true
	}
	if h.authorizer != nil && h.authorizer(r, sessionID, processID) {
		return true
	}
	info, err := h.rt.Processes().Get(ctx, logical, processID)
	return err == nil && rpc.TokenMatches(rpc.OfferedTokens(r), []byte(info.RelayToken))
}

// bridge is one attached socket.
type bridge struct {
	h                    *Handler
	c                    *websocket.Conn
	conn                 *batchConn
	att                  *runtime.Attachment
	proc                 *runtime.ProcessHandle
	sessionID, processID string
	log                  zerolog.Logger
}

type closeReason struct {
	code   websocket.StatusCode
	reason string
}

func (b *bridge) run() {
	// ctx is the socket's: reads and stdin writes end with it. stop ends the
	// bridge from outside (shutdown, a peer that stopped answering pings)
	// while ctx stays up for the close handshake.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, stopBridge := context.WithCancelCause(ctx)
	defer stopBridge(nil)
	b.h.track(b, stopBridge)
	defer b.h.untrack(b)
	keepaliveEnded := make(chan struct{})
	go func() {
		defer close(keepaliveEnded)
		rpc.Keepalive(ctx, b.c, b.h.pingInterval, b.h.pingTimeout, b.log)
		stopBridge(errPeerGone)
	}()

	readDone := make(chan error, 1)
	readEnded := make(chan struct{})
	go func() {
		defer close(readEnded)
		readDone <- b.readLoop(ctx)
	}()
	why := b.writeLoop(stop, readDone)
	// Close before cancelling: cancelling a pending read makes the websocket
	// library drop the connection without the close frame and its reason.
	_ = b.c.Close(why.code, why.reason)
	cancel()
	// The reader ends with the socket, even one blocked writing to a
	// process that stopped reading its stdin (cancel aborts that write).
	<-readEnded
	<-keepaliveEnded
	b.log.Info().Int("code", int(why.code)).Str("reason", why.reason).Msg("relay closed")
	b.h.observe(Event{Kind: "close", SessionID: b.sessionID, ProcessID: b.processID})
}

// writeLoop sends the backlog then live lines, one text frame per line,
// until the process ends, the peer goes, or a newer attacher takes over.
func (b *bridge) writeLoop(ctx context.Context, readDone <-chan error) closeReason {
	// Once sent, the backlog is garbage: the bridge must not keep it.
	backlog := b.att.Backlog
	b.att.Backlog = nil
	if ctx.Err() != nil {
		// Stopped before it began (a shutdown): nothing is sent.
		b.att.Detach(backlog...)
		return closeReason{websocket.StatusGoingAway, context.Cause(ctx).Error()}
	}
	if why, ok := b.sendAll(ctx, backlog); !ok {
		return why
	}
	for {
		select {
		case <-b.att.Ready:
			if why, ok := b.sendAll(ctx, nil); !ok {
				return why
			}
		case <-b.att.TakenOver:
			return closeReason{CloseTakenOver, "taken over by a newer attach"}
		case <-ctx.Done():
			b.att.Detach()
			return closeReason{websocket.StatusGoingAway, context.Cause(ctx).Error()}
		case err := <-readDone:
			b.att.Detach()
			if err != nil && errors.Is(err, errStdin) {
				return closeReason{CloseStdioUnavailable, "managed process stdin unavailable"}
			}
			return closeReason{websocket.StatusNormalClosure, "peer closed"}
		}
	}
}

// sendAll sends lines, then what the attachment has queued, batch after
// batch until the queue is empty. When it stops the bridge (a failed
// write, a line too long, the end of the stream) the attachment is
// detached, giving back what was not sent.
func (b *bridge) sendAll(ctx context.Context, lines []runtime.Line) (closeReason, bool) {
	for {
		if len(lines) > 0 {
			n, why, ok := b.sendBatch(ctx, lines)
			if !ok {
				b.att.Detach(unsent(lines[n], lines[n+1:])...)
				return why, false
			}
		}
		var ended bool
		lines, ended = b.att.Take()
		if len(lines) > 0 {
			continue
		}
		if ended {
			b.att.Detach()
			<-b.proc.Done()
			return closeReason{websocket.StatusNormalClosure, fmt.Sprintf("process exited with code %d", b.proc.ExitCode())}, false
		}
		return closeReason{}, true
	}
}

// unsent returns what goes back to the replay buffer when sending failed
// at line: the line and the rest, except a dropped line's marker. The 1009
// close is that line's one report; handing the marker back made every later
// attach close with 1009 before delivering anything.
func unsent(line runtime.Line, rest []runtime.Line) []runtime.Line {
	if line.TooLong {
		return rest
	}
	return append([]runtime.Line{line}, rest...)
}

// sendBatch writes lines as frames, one per line, sharing the syscalls: the
// connection is corked for the batch. It stops at a line dropped as too
// long (after sending those before it) and at a failed write. n is the
// index of the first line not known to be delivered.
func (b *bridge) sendBatch(ctx context.Context, lines []runtime.Line) (n int, why closeReason, ok bool) {
	// The whole batch gets writeTimeout; ending the bridge (shutdown, a
	// silent peer) aborts it at once. An abort that lands after the last
	// write must not outlive the batch: the deadline it left in the past
	// would fail the close frame that follows, and the peer would see the
	// connection drop instead of 1001. An abort that failed a write keeps
	// it, so the close does not wait on a peer that stopped reading.
	_ = b.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	aborted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = b.conn.SetWriteDeadline(time.Unix(1, 0))
		close(aborted)
	})
	defer func() {
		if !stop() {
			<-aborted // the abort has begun: let it finish before deciding
			if !ok {
				return
			}
		}
		_ = b.conn.SetWriteDeadline(time.Time{})
	}()
	b.conn.cork()
	sent := 0
	for i, line := range lines {
		switch {
		case line.OverBudget:
			why = closeReason{websocket.StatusMessageTooBig, "stdout line dropped: unfinished lines exceed limits.relay_line_buffer_bytes"}
		case line.TooLong:
			why = closeReason{websocket.StatusMessageTooBig, fmt.Sprintf("stdout line exceeds %d bytes", MaxMessageBytes)}
		case b.h.maxFrame > 0 && len(line.Data) >= b.h.maxFrame:
			why = closeReason{websocket.StatusMessageTooBig, fmt.Sprintf("stdout line of %d bytes exceeds the relay's %d-byte frame limit", len(line.Data), b.h.maxFrame)}
		}
		if why.code != 0 {
			if b.conn.uncork() != nil {
				return 0, closeReason{websocket.StatusGoingAway, "write failed"}, false
			}
			b.observeOut(i, sent)
			return i, why, false
		}
		data := line.Data
		if !utf8.Valid(data) {
			data = bytes.ToValidUTF8(data, []byte("\uFFFD"))
		}
		// No deadline on the context: the connection's covers the batch,
		// and the library would arm a timer per frame for one.
		if err := b.c.Write(context.Background(), websocket.MessageText, data); err != nil {
			_ = b.conn.uncork()
			return 0, closeReason{websocket.StatusGoingAway, "write failed"}, false
		}
		sent += len(data)
	}
	if b.conn.uncork() != nil {
		return 0, closeReason{websocket.StatusGoingAway, "write failed"}, false
	}
	b.observeOut(len(lines), sent)
	return len(lines), closeReason{}, true
}

func (b *bridge) observeOut(frames, size int) {
	if frames > 0 {
		b.h.observe(Event{Kind: "out", SessionID: b.sessionID, ProcessID: b.processID, Bytes: size, Count: frames})
	}
}

var errStdin = errors.New("stdin write failed")

// readLoop writes each incoming text frame to stdin as one line.
func (b *bridge) readLoop(ctx context.Context) error {
	for {
		typ, r, err := b.c.Reader(ctx)
		if err != nil {
			return err
		}
		msg, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		if typ != websocket.MessageText {
			b.log.Debug().Msg("ignored a binary frame on the relay")
			continue
		}
		if len(msg) == 0 || msg[len(msg)-1] != '\n' {
			msg = append(msg, '\n')
		}
		wctx, cancel := context.WithTimeout(ctx, b.h.stdinTimeout)
		err = b.proc.Write(wctx, msg)
		cancel()
		if err != nil {
			return fmt.Errorf("%w: %v", errStdin, err)
		}
		b.h.observe(Event{Kind: "in", SessionID: b.sessionID, ProcessID: b.processID, Bytes: len(msg), Count: 1})
	}
}
