package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/e2bapi"
	"github.com/boxrt/boxrt/internal/mcpserver"
	"github.com/boxrt/boxrt/internal/statelock"
	"github.com/boxrt/boxrt/relay"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
)

// Protocol is the envelope spoken on stdio and /rpc/ws.
type Protocol string

const (
	// JSONRPC is JSON-RPC 2.0.
	JSONRPC Protocol = "jsonrpc"
	// LangBot is LangBot's action RPC, with its tenancy contexts required
	// and its headers on /rpc/ws and the relay.
	LangBot Protocol = "langbot"
)

// Options is what serve was asked for, read and checked by the CLI.
type Options struct {
	// Version is reported by box_health and the start-up log line.
	Version string
	Config  runtime.Config
	// StateDir is locked for the server's life: the sessions labelled
	// with its instance id are this server's alone.
	StateDir string
	// PrivateStateDir says the spawner removes StateDir afterwards, so
	// every session ends at Close, persistent and suspended ones too.
	PrivateStateDir bool
	// Token is the configured control token; "" makes the server generate
	// one.
	Token string
	// Listen is the HTTP address of /rpc/ws, the relay, health and
	// metrics; "" serves no HTTP. AllowedHosts are more names the
	// Host/Origin guard accepts.
	Listen       string
	AllowedHosts []string
	// MetricsPublic serves /metrics without the control token.
	MetricsPublic bool
	Protocol      Protocol
	// Stdio serves the protocol on Stdin and Stdout as well.
	Stdio bool
	// MCP serves the Model Context Protocol (internal/mcpserver) instead
	// of JSON-RPC on stdio, and at /mcp on the listener: boxrt mcp.
	MCP    bool
	Stdin  io.Reader
	Stdout io.Writer
	// Stderr gets the one notice saying where a generated token is kept.
	Stderr io.Writer
	// Trust names the host's instance (LANGBOT_BOX_TRUSTED_INSTANCE_UUID).
	Trust *actions.Trust
	// LangBotConfig is LANGBOT_BOX_CONFIG as the host set it; the tenancy
	// layer takes its start-up settings from it.
	LangBotConfig string
	// Connect is the host to dial (serve --connect, checked by
	// dialout.CheckURL): the protocol is served on that connection, the
	// relay and files on its streams. Token must be set.
	Connect string
	// Keepalive pings idle WebSocket peers (control and relay) this often.
	Keepalive time.Duration
	Log       zerolog.Logger
	// LogDropped counts the log lines lost to a stuck stderr, exported as
	// a metric.
	LogDropped func() uint64
}

// Server is one serving boxrt: New builds it, Run serves, Close ends it.
type Server struct {
	opts  Options
	log   zerolog.Logger
	lock  *statelock.Lock
	token controlToken
	// ln is nil without a listener; url is then "".
	ln      net.Listener
	url     string
	guard   *rpc.HostGuard
	metrics *metrics
	skills  *skills.Store
	rt      *runtime.Runtime
	tenancy *actions.Tenancy
	rpc     *rpc.Server
	auth    *rpc.Authenticator
	relay   *relay.Handler
	e2b     *e2bapi.Handler
	mcp     *mcpserver.Server
	http    *http.Server
}

// New builds the server and starts its runtime, which selects a backend
// and adopts the sessions of the state directory within ctx. It serves
// nothing before Run. An error is a refusal to start (the configuration,
// the state directory, the address).
func New(ctx context.Context, opts Options) (_ *Server, err error) {
	s := &Server{opts: opts, log: opts.Log}
	if was := ensureProcs(); was != 0 {
		s.log.Info().Int("was", was).Int("gomaxprocs", minProcs).Msg("one CPU available: GOMAXPROCS raised so a read waiting on the connection keeps its P (set GOMAXPROCS to choose)")
	}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	if err = s.claimStateDir(); err != nil {
		return nil, err
	}
	if err = s.listen(); err != nil {
		return nil, err
	}
	if err = s.startRuntime(ctx); err != nil {
		return nil, err
	}
	s.wire()
	return s, nil
}

// Run serves until ctx ends or, with stdio, the peer closes stdin. A
// failing HTTP listener is logged and stdio keeps serving.
func (s *Server) Run(ctx context.Context) {
	go newBurstReleaser().run(ctx, memoryCheckEvery, s.log.With().Str("component", "memory").Logger())
	if s.http != nil {
		go func() {
			if err := s.http.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error().Err(err).Msg("http listener failed")
			}
		}()
	}
	s.log.Info().Str("version", s.opts.Version).Bool("stdio", s.opts.Stdio).Str("protocol", string(s.opts.Protocol)).Bool("mcp", s.opts.MCP).Str("listen", s.url).
		Str("connect", s.opts.Connect).Str("token_file", s.token.file).Str("instance_id", s.rt.InstanceID()).Msg("boxrt serving")
	if s.opts.Connect != "" {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.dialOut(ctx)
		}()
		defer func() { <-done }()
	}
	if !s.opts.Stdio {
		<-ctx.Done()
		s.log.Info().Msg("signal received; shutting down")
		return
	}
	done := make(chan struct{})
	go func() {
		s.serveStdio(ctx)
		close(done)
	}()
	select {
	case <-done:
		s.log.Info().Msg("stdin closed; shutting down")
	case <-ctx.Done():
		s.log.Info().Msg("signal received; shutting down")
	}
}

// serveStdio serves stdio's protocol until the peer closes stdin or ctx
// ends.
func (s *Server) serveStdio(ctx context.Context) {
	growStdoutPipe(s.opts.Stdout, s.log)
	if s.mcp == nil {
		s.rpc.ServeStdio(ctx, s.opts.Stdin, s.opts.Stdout)
		return
	}
	// The SDK closes its transport's ends; stdin and stdout stay the
	// process's.
	err := s.mcp.ServeStdio(ctx, io.NopCloser(s.opts.Stdin), nopWriteCloser{s.opts.Stdout})
	if err != nil && ctx.Err() == nil {
		s.log.Warn().Err(err).Msg("MCP connection on stdio ended with an error")
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// relayDrainTimeout bounds waiting at shutdown for relay peers to answer
// the close; a close handshake is one round trip.
const relayDrainTimeout = time.Second

// Close shuts the server down within ctx and gives back the state
// directory. The relay is drained before the runtime stops the processes
// it bridges, but gets a slice of the budget only: a peer that does not
// answer the close must not leave the runtime no time to destroy
// sessions. The error is what the runtime's shutdown left.
func (s *Server) Close(ctx context.Context) error {
	relayCtx, cancelRelay := context.WithTimeout(ctx, relayDrainTimeout)
	if err := s.relay.Close(relayCtx); err != nil {
		s.log.Warn().Err(err).Msg("relay sockets cut at shutdown: peers did not answer the close")
	}
	cancelRelay()
	s.rpc.Close(ctx)
	if s.mcp != nil {
		// Before the runtime closes: the connections' sessions are
		// deleted through the catalogue.
		s.mcp.Close(ctx)
	}
	if s.http != nil {
		_ = s.http.Shutdown(ctx)
	}
	s.e2b.Close()
	err := s.rt.Close(ctx)
	s.release()
	return err
}

// release gives back the listener (when Run did not serve it), the skill
// store and the state directory, whichever New got to.
func (s *Server) release() {
	if s.ln != nil {
		_ = s.ln.Close() // already closed if Run served it
	}
	if s.skills != nil {
		_ = s.skills.Close()
	}
	if s.lock != nil {
		_ = s.lock.Release()
	}
}

// claimStateDir locks the state directory, then keeps or generates the
// control token (a generated one may live there).
func (s *Server) claimStateDir() error {
	lock, err := statelock.Acquire(s.opts.StateDir)
	if err != nil {
		return err
	}
	s.lock = lock
	if s.opts.Token != "" {
		s.token = controlToken{value: s.opts.Token}
		return nil
	}
	if s.token, err = generateToken(s.opts.Stdio, s.opts.StateDir); err != nil {
		return err
	}
	if s.token.file != "" {
		// Where, never what: the token itself is not logged.
		fmt.Fprintf(s.opts.Stderr, "boxrt: no control token configured; using the generated one in %s (clients send \"Authorization: Bearer $(cat %s)\"; boxrt call --url reads it itself)\n", s.token.file, s.token.file)
	}
	return nil
}

// listen opens the HTTP listener, if one is asked for.
func (s *Server) listen() error {
	if s.opts.Listen == "" {
		return nil
	}
	guard, err := rpc.NewHostGuard(s.opts.Listen, s.opts.AllowedHosts)
	if err != nil {
		return fmt.Errorf("--listen: %v", err)
	}
	s.guard = guard
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil && s.opts.Stdio && s.opts.Protocol == LangBot {
		// As the reference: a LangBot host that respawns its stdio child
		// must not lose the action RPC to a port still held; only the
		// relay and health are missing.
		s.log.Warn().Err(err).Str("listen", s.opts.Listen).Msg("cannot listen; serving stdio without the relay")
		return nil
	}
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %v (use --listen 127.0.0.1:0 for a free port, or --listen '' for none)", s.opts.Listen, err)
	}
	s.ln, s.url = ln, "http://"+ln.Addr().String()
	return nil
}
