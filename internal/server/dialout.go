package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/internal/dialout"
	"github.com/boxrt/boxrt/rpc"
)

// Dial-out timing: how long a dropped connection is kept for the host to
// be reached again (execs and their answers wait that long), and the wait
// between failed dials.
const (
	DialOutWindow         = 5 * time.Minute
	dialOutBackoffInitial = time.Second
	dialOutBackoffMax     = 30 * time.Second
	dialOutJitter         = 0.2
)

// dialOut serves --connect until ctx ends: JSON-RPC on the logical
// connection, and the HTTP routes (relay, files) on the streams the host
// opens, so nothing listens for the host.
func (s *Server) dialOut(ctx context.Context) {
	streams := dialout.NewListener()
	hs := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(streams) }()
	d := &dialer{
		URL: s.opts.Connect, Token: s.token.value, RuntimeID: s.rt.InstanceID(), Version: s.opts.Version,
		Serve:     func(c *dialout.Conn) { s.rpc.ServeFrames(ctx, c, rpc.TransportWebSocket) },
		Streams:   streams,
		Conn:      dialout.Options{Window: DialOutWindow, Classify: classifyFrame, OnLost: reportLost(s.log)},
		Keepalive: s.opts.Keepalive, BackoffInitial: dialOutBackoffInitial, BackoffMax: dialOutBackoffMax, Jitter: dialOutJitter,
		Log: s.log.With().Str("component", "dialout").Logger(),
	}
	d.Run(ctx)
	_ = hs.Close()
}

// notificationPrefix starts every notification the JSON-RPC codec encodes
// (answers start with the id).
var notificationPrefix = []byte(`{"jsonrpc":"2.0","method":`)

// lostPrefix starts box_answers_lost, a notification kept like an answer:
// the host's calls wait on it.
var lostPrefix = append(append([]byte(nil), notificationPrefix...), `"`+dialout.AnswersLostNotification+`"`...)

// classifyFrame: notifications (exec output) are Bulk, dropped first
// while the host is away; answers are Keep.
func classifyFrame(frame []byte) dialout.Class {
	if bytes.HasPrefix(frame, notificationPrefix) && !bytes.HasPrefix(frame, lostPrefix) {
		return dialout.Bulk
	}
	return dialout.Keep
}

// reportLost sends box_answers_lost after a resumption that could not
// replay everything: the ids of the answers lost and how many
// notifications were dropped.
func reportLost(log zerolog.Logger) func(string, dialout.Lost) ([]byte, [][]byte) {
	return func(connID string, lost dialout.Lost) ([]byte, [][]byte) {
		ids := lost.IDs
		if ids == nil {
			ids = []json.RawMessage{}
		}
		type params struct {
			IDs               []json.RawMessage `json:"ids"`
			NotificationsLost int               `json:"notifications_lost"`
		}
		frame, _ := json.Marshal(struct {
			JSONRPC string `json:"jsonrpc"`
			Method  string `json:"method"`
			Params  params `json:"params"`
		}{"2.0", dialout.AnswersLostNotification, params{ids, lost.Bulk}})
		log.Warn().Int("answers_lost", len(lost.IDs)).Int("notifications_lost", lost.Bulk).Str("conn_id", connID).Msg("dial-out: the replay buffer overflowed while the host was away")
		return frame, nil
	}
}

// dialer is serve --connect: it dials the host, keeps a logical
// connection across the links it dials (internal/dialout), and hands each
// new logical connection to serve.
type dialer struct {
	// URL is the host's ws:// or wss:// endpoint (CheckURL).
	URL string
	// Token is sent as "Authorization: Bearer".
	Token string
	// RuntimeID and Version go into every Hello.
	RuntimeID, Version string
	// Serve serves one logical connection until it ends (the JSON-RPC
	// frame loop); it runs on its own goroutine.
	Serve func(*dialout.Conn)
	// Streams receives the streams the host opens.
	Streams *dialout.Listener
	// Conn configures each logical connection (window, limits, classes,
	// what to do about frames lost).
	Conn dialout.Options
	// Keepalive pings the host this often; a pong missing for half as long
	// breaks the link.
	Keepalive time.Duration
	// BackoffInitial, BackoffMax and Jitter are the wait between failed
	// dials (Backoff). A link that lived at least BackoffInitial resets it.
	BackoffInitial, BackoffMax time.Duration
	Jitter                     float64
	Log                        zerolog.Logger

	wg sync.WaitGroup // Serve's goroutines
}

// handshakeTimeout bounds the dial and the Hello/Welcome exchange.
const handshakeTimeout = 15 * time.Second

// Run dials and serves until ctx ends; then it ends the logical
// connection and waits for its frame loop.
func (r *dialer) Run(ctx context.Context) {
	var cur *dialout.Conn
	defer func() {
		if cur != nil {
			cur.End(nil)
		}
		r.wg.Wait()
	}()
	failures := 0
	for ctx.Err() == nil {
		if failures > 0 {
			d := dialout.Backoff(failures, r.BackoffInitial, r.BackoffMax, r.Jitter, 2*rand.Float64()-1)
			r.Log.Info().Dur("delay", d).Int("failures", failures).Msg("dial-out: waiting before dialing the host again")
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		l, next, err := r.connect(ctx, cur)
		cur = next
		if err != nil {
			if ctx.Err() == nil {
				r.Log.Warn().Err(err).Msg("dial-out: cannot reach the host")
			}
			failures++
			continue
		}
		up := time.Now()
		select {
		case <-l.Done():
		case <-ctx.Done():
			l.CloseWith(websocket.StatusGoingAway, "boxrt shutting down")
			return
		}
		r.Log.Info().Str("conn_id", cur.ID()).Msg("dial-out: link to the host lost; resuming")
		if time.Since(up) >= r.BackoffInitial {
			failures = 0
		} else {
			failures++
		}
	}
}

// connect dials one link and resumes cur on it, or starts a new logical
// connection when there is none to resume or the host does not know it.
func (r *dialer) connect(ctx context.Context, cur *dialout.Conn) (*dialout.Link, *dialout.Conn, error) {
	hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	ws, err := r.dial(hctx)
	if err != nil {
		return nil, cur, err
	}
	l := dialout.NewLink(ws, r.Streams.Offer, r.Keepalive, r.Keepalive/2)
	hello := dialout.Hello{RuntimeID: r.RuntimeID, BoxrtVersion: r.Version}
	var w dialout.Welcome
	if cur != nil && !cur.Ended() {
		err = cur.Resume(l, func(received uint64) (uint64, error) {
			hello.ConnID, hello.Received = cur.ID(), received
			if w, err = dialout.Exchange(hctx, ws, hello); err != nil {
				return 0, err
			}
			if !w.Resumed {
				return 0, errNotResumed
			}
			return w.Received, nil
		})
		switch {
		case err == nil:
			r.Log.Info().Str("conn_id", cur.ID()).Msg("dial-out: connection resumed")
			return l, cur, nil
		case !errors.Is(err, errNotResumed):
			l.Close()
			return nil, cur, err
		}
		r.Log.Warn().Str("conn_id", cur.ID()).Msg("dial-out: the host does not know the connection (it restarted or gave up on it); calls in flight on it are cancelled, sessions stay")
		cur.End(errNotResumed)
	} else if w, err = dialout.Exchange(hctx, ws, hello); err != nil {
		l.Close()
		return nil, cur, err
	}
	if w.Resumed {
		l.Close()
		return nil, nil, fmt.Errorf("the host resumed %q, which was not asked for", w.ConnID)
	}
	next := dialout.NewConn(w.ConnID, r.Conn)
	if err := next.Resume(l, func(uint64) (uint64, error) { return 0, nil }); err != nil {
		l.Close()
		next.End(err)
		return nil, nil, err
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.Serve(next)
	}()
	r.Log.Info().Str("conn_id", next.ID()).Msg("dial-out: connected to the host")
	return l, next, nil
}

var errNotResumed = errors.New("the host started a new connection")

// dial opens the WebSocket with the token in the Authorization header.
func (r *dialer) dial(ctx context.Context) (*websocket.Conn, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+r.Token)
	ws, resp, err := websocket.Dial(ctx, r.URL, &websocket.DialOptions{HTTPHeader: h, Subprotocols: []string{dialout.Subprotocol}})
	if err == nil {
		return ws, nil
	}
	if resp != nil {
		var body []byte
		if resp.Body != nil {
			body, _ = io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
		}
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return nil, fmt.Errorf("the host refused the control token (HTTP %d): %s; check --token-file or BOXRT_CONTROL_TOKEN", resp.StatusCode, strings.TrimSpace(string(body)))
		}
		return nil, fmt.Errorf("WebSocket handshake with %s: HTTP %d: %s", r.URL, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	return nil, fmt.Errorf("dialing %s: %w", r.URL, err)
}
