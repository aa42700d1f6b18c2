package reconnect

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"time"
)

// Defaults: the LangBot host's own heartbeat and reconnect numbers, so a
// host ported from it behaves the same (see the package doc).
const (
	DefaultHeartbeatInterval = 20 * time.Second
	DefaultHeartbeatTimeout  = 15 * time.Second
	DefaultHeartbeatFailures = 3
	DefaultBackoffInitial    = 3 * time.Second
	DefaultBackoffMax        = 60 * time.Second
	DefaultJitter            = 0.2
	DefaultConnectTimeout    = 30 * time.Second
	DefaultStopTimeout       = 5 * time.Second

	// MaxMessageBytes is the largest JSON-RPC message either side sends
	// (docs/protocol.md, "Transports"); a larger incoming message is a protocol
	// violation and ends the link.
	MaxMessageBytes = 16 << 20
)

// Caller makes JSON-RPC calls. *Client implements it; the OnConnect hook
// gets one bound to the new link (see WithOnConnect).
type Caller interface {
	Call(ctx context.Context, method string, params, result any) error
}

// State is a link state reported to WithOnStateChange.
type State int

const (
	// StateConnected: a link is up and OnConnect succeeded; queued calls
	// are being released.
	StateConnected State = iota + 1
	// StateDisconnected: the link was lost (err says why); calls wait.
	StateDisconnected
	// StateConnectFailed: a (re)connect attempt failed (err says why); the
	// next one follows after the backoff.
	StateConnectFailed
	// StateClosed: Close was called; nothing is left running.
	StateClosed
)

func (s State) String() string {
	switch s {
	case StateConnected:
		return "connected"
	case StateDisconnected:
		return "disconnected"
	case StateConnectFailed:
		return "connect_failed"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Option configures a Client.
type Option func(*options)

type options struct {
	// spawn mode
	command     []string
	env         []string
	dir         string
	stderr      io.Writer
	stopTimeout time.Duration
	stateDir    string
	// cleanup runs once the Client has stopped everything (Spawn's
	// private state directory).
	cleanup func()

	// dial mode
	httpBase string // the dialed runtime as http(s)://host:port (files)
	token    string
	tokenSet bool // WithToken was given: no discovery
	// noToken says why no token was sent, for a runtime that wants one.
	noToken    string
	httpClient *http.Client
	header     http.Header

	hbInterval, hbTimeout time.Duration
	hbFailures            int
	backoffInitial        time.Duration
	backoffMax            time.Duration
	jitter                float64
	connectTimeout        time.Duration

	onConnect     func(ctx context.Context, c Caller) error
	onStateChange func(State, error)
	// onNotification gets every notification boxrt sends.
	onNotification func(method string, params json.RawMessage)
	clock          Clock
	logger         *slog.Logger

	// test seams
	rand      func() float64 // uniform in [0, 1)
	connector func(ctx context.Context) (*link, error)
}

func defaultOptions() options {
	return options{
		command:        []string{"boxrt", "serve", "--stdio"},
		stderr:         os.Stderr,
		stopTimeout:    DefaultStopTimeout,
		hbInterval:     DefaultHeartbeatInterval,
		hbTimeout:      DefaultHeartbeatTimeout,
		hbFailures:     DefaultHeartbeatFailures,
		backoffInitial: DefaultBackoffInitial,
		backoffMax:     DefaultBackoffMax,
		jitter:         DefaultJitter,
		connectTimeout: DefaultConnectTimeout,
		clock:          realClock{},
		logger:         slog.New(slog.DiscardHandler),
		rand:           rand.Float64,
	}
}

// WithCommand sets the child's command line for Spawn; the default is
// "boxrt serve --stdio", with boxrt looked up in PATH. Add flags such as
// "--listen", "127.0.0.1:0" here. A command line that names --state-dir
// keeps that directory (see WithStateDir).
func WithCommand(name string, args ...string) Option {
	return func(o *options) { o.command = append([]string{name}, args...) }
}

// WithEnv sets the child's whole environment (default: this process's).
// To add variables, pass append(os.Environ(), "BOXRT_CONFIG=…").
func WithEnv(env []string) Option {
	return func(o *options) {
		if env == nil {
			o.env = nil
			return
		}
		// An empty, non-nil slice means an empty environment to os/exec;
		// keep it non-nil.
		o.env = append(make([]string, 0, len(env)), env...)
	}
}

// WithStateDir makes the spawned runtime keep its state (instance id,
// bwrap sessions, suspended and persistent sessions) in dir, passed as
// BOXRT_STATE_DIR, so a respawned or later runtime finds its sessions
// again. dir is locked while a runtime uses it: a second runtime on it
// exits with an error naming the first.
//
// Without it (or BOXRT_STATE_DIR in WithEnv), Spawn gives the Client a
// private temporary state directory, shared by its respawned children and
// removed by Close, as BOXRT_PRIVATE_STATE_DIR: every session, even a
// persistent one, ends when a child exits. A private runtime never adopts,
// or destroys, the sessions of a boxrt serving on this machine's default
// state directory. A --state-dir on the command line wins over both.
//
// For Dial to a loopback URL without WithToken it is the directory whose
// control-token file is read (default DefaultStateDir(); see
// DiscoverToken), as `boxrt call --state-dir` does.
func WithStateDir(dir string) Option { return func(o *options) { o.stateDir = dir } }

// WithDir sets the child's working directory (default: this process's).
func WithDir(dir string) Option { return func(o *options) { o.dir = dir } }

// WithStderr sends the child's stderr (boxrt's logs) to w; default
// os.Stderr. Writes come from one goroutine; w need not be thread-safe
// unless it is shared.
func WithStderr(w io.Writer) Option {
	return func(o *options) {
		if w == nil {
			w = io.Discard
		}
		o.stderr = w
	}
}

// WithStopTimeout sets how long Close waits for the child after closing
// its stdin (boxrt's graceful shutdown), and again after SIGTERM, before
// SIGKILL. A link declared dead skips the stdin step.
func WithStopTimeout(d time.Duration) Option { return func(o *options) { o.stopTimeout = d } }

// WithToken sets the control token for Dial. It is sent only as
// "Authorization: Bearer <token>" on the WebSocket handshake, never in the
// URL. Without it Dial finds one as DiscoverToken does; WithToken("")
// sends none.
func WithToken(token string) Option {
	return func(o *options) { o.token, o.tokenSet = token, true }
}

// WithHTTPClient sets the HTTP client for the WebSocket handshake (TLS
// settings for wss, proxies). Its transport must support HTTP/1.1 upgrades.
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.httpClient = c } }

// WithHeader adds headers to the WebSocket handshake.
func WithHeader(h http.Header) Option { return func(o *options) { o.header = h.Clone() } }

// WithHeartbeat sets how often __ping is sent, how long each may take, and
// after how many consecutive failures the link is declared dead and
// replaced. Defaults: 20 s, 15 s, 3. An interval ≤ 0 turns the heartbeat
// off (a dead child or closed socket is still noticed at once; a silent
// hang then only by call timeouts).
//
// Pings are paced from the start of the previous one, so a silent link is
// declared dead about failures × interval + timeout after it went quiet
// (75 s with the defaults). Only a missing answer counts as a failure: an
// error response, even "busy", proves the link is alive.
func WithHeartbeat(interval, timeout time.Duration, failures int) Option {
	return func(o *options) {
		o.hbInterval, o.hbTimeout = interval, timeout
		if failures < 1 {
			failures = 1
		}
		o.hbFailures = failures
	}
}

// WithBackoff sets the reconnect backoff: the first wait after a failed
// attempt, doubling per consecutive failure up to max. Defaults 3 s, 60 s.
// An initial wait below 10 ms is raised to 10 ms, so that a runtime that
// refuses connections is not hammered in a tight loop. See WithJitter for
// the randomisation and Client for when a reconnect does not wait at all.
func WithBackoff(initial, maxWait time.Duration) Option {
	return func(o *options) {
		initial = max(initial, minBackoff)
		o.backoffInitial, o.backoffMax = initial, max(maxWait, initial)
	}
}

const minBackoff = 10 * time.Millisecond

// WithJitter sets the jitter fraction j in [0, 1): every backoff wait is
// base × (1 + j × u) with u uniform in [-1, 1), i.e. within ±j of the
// schedule (default ±20 %). 0 gives the exact schedule.
func WithJitter(fraction float64) Option {
	return func(o *options) {
		o.jitter = min(max(fraction, 0), 0.99)
	}
}

// WithConnectTimeout bounds one connection attempt: starting the child or
// the WebSocket handshake, the first __ping and the OnConnect hook.
// Default 30 s (the LangBot host's handshake limit).
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithOnConnect runs fn after every (re)connect, before calls that queued
// while the link was down are released; typically it sends box_init with
// the host's config. fn must make its calls through c, which talks to the
// new link only: the Client itself is not ready yet, so its Call would
// wait for fn. If fn fails the link is dropped and the attempt counts as
// failed (backoff applies); a non-retryable *Error from fn on the first
// connect makes Spawn/Dial fail. fn's ctx ends with the connect timeout.
func WithOnConnect(fn func(ctx context.Context, c Caller) error) Option {
	return func(o *options) { o.onConnect = fn }
}

// WithOnStateChange is called on every state change, from the client's
// supervising goroutine: it must return quickly and must not call Close.
func WithOnStateChange(fn func(s State, err error)) Option {
	return func(o *options) { o.onStateChange = fn }
}

// WithOnNotification is called with every notification boxrt sends
// (method and raw params), in order, on the link's reading goroutine: it
// must return quickly. Exec output is easier to take per exec through
// Client.CallStream.
func WithOnNotification(fn func(method string, params json.RawMessage)) Option {
	return func(o *options) { o.onNotification = fn }
}

// WithClock replaces the time source for heartbeat and backoff (tests).
func WithClock(c Clock) Option { return func(o *options) { o.clock = c } }

// WithLogger sets a logger for link events (default: none).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }
