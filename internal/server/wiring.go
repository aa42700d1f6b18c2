package server

import (
	"context"
	"net/http"
	"time"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/backendfactory"
	"github.com/boxrt/boxrt/internal/e2bapi"
	"github.com/boxrt/boxrt/internal/mcpserver"
	"github.com/boxrt/boxrt/relay"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
)

// langbotMaxRelayFrame: the LangBot host's relay client (websockets with
// its default max_size) refuses messages of 1 MiB and more.
const langbotMaxRelayFrame = 1 << 20

// startRuntime opens the skill store and the runtime and starts the
// runtime's background work.
func (s *Server) startRuntime(ctx context.Context) error {
	s.metrics = newMetrics()
	s.metrics.logDrops(s.opts.LogDropped)
	// The skill store reads the live configuration (box_init may move its
	// root) through the runtime, and the runtime resolves skill mounts
	// through the store; the store opens (and clears leftovers) before the
	// runtime exists, on the start-up configuration.
	s.skills = actions.NewSkillStore(func() runtime.Config {
		if s.rt == nil {
			return s.opts.Config
		}
		return s.rt.Config()
	})
	rt, err := runtime.New(s.opts.Config, backendfactory.New, s.opts.StateDir, s.runtimeOptions()...)
	if err != nil {
		return err
	}
	s.rt = rt
	rt.Start(ctx)
	return nil
}

// runtimeOptions are the runtime's log, the exec metrics, skills from the
// store (per Workspace scope), and with a private state directory
// sessions that all end with the process.
func (s *Server) runtimeOptions() []runtime.Option {
	opts := []runtime.Option{runtime.WithLogger(s.log.With().Str("component", "runtime").Logger()),
		runtime.WithExecObserver(s.metrics.exec), runtime.WithSkillResolver(skills.ContextResolver{Base: s.skills})}
	if s.opts.PrivateStateDir {
		opts = append(opts, runtime.WithSessionsEndingAtClose())
	}
	return opts
}

// wire builds what answers requests around the runtime: the method
// catalogue inside the tenancy layer, the frame loop (or MCP's tools over
// the same tenancy layer), the relay and the HTTP routes.
func (s *Server) wire() {
	langbot := s.opts.Protocol == LangBot
	// Only a token boxrt made up for this stdio session goes back to the
	// host; a configured one is the host's already.
	var relayToken string
	if s.token.generated && s.opts.Stdio {
		relayToken = s.token.value
	}
	dispatcher := actions.New(s.rt, s.skills, actions.Server{
		Version:    s.opts.Version,
		RelayURL:   func() string { return s.url },
		RelayToken: relayToken,
	})
	s.tenancy = actions.NewTenancy(dispatcher, s.opts.Trust, actions.TenancyOptions{Required: langbot, LangBot: langbot,
		OpenWebSocket: langbot && !s.opts.Stdio && s.opts.Token == "", Log: s.log.With().Str("component", "tenancy").Logger()})
	s.tenancy.ApplyStartupConfig(s.opts.LangBotConfig)
	s.metrics.register(s.rt, s.tenancy.Methods())

	rpcLog := s.log.With().Str("component", "rpc").Logger()
	keepalive := s.opts.Keepalive
	s.rpc = rpc.NewServer(s.tenancy,
		rpc.WithCodec(s.codec()),
		rpc.WithKeepalive(keepalive, keepalive/2),
		rpc.WithInline("__ping", "box_health", "box_get_backend_info"),
		rpc.WithQueueKey(actions.QueueKey),
		rpc.WithErrorEncoder(actions.EncodeError),
		rpc.WithLogger(rpcLog),
		rpc.WithObserver(func(call rpc.Call) { logCall(rpcLog, call); s.metrics.observe(call) }),
	)
	s.auth = rpc.NewAuthenticator(s.token.value)
	relayOpts := []relay.Option{relay.WithOperator(s.auth), relay.WithLogger(s.log.With().Str("component", "relay").Logger()),
		relay.WithObserver(s.metrics.relay), relay.WithKeepalive(keepalive, keepalive/2),
		relay.WithAuthorizer(s.tenancy.RelayAuthorizer(s.opts.Token)), relay.WithScope(s.tenancy.RequestPlacement)}
	if langbot {
		relayOpts = append(relayOpts, relay.WithMaxFrame(langbotMaxRelayFrame))
	}
	s.relay = relay.New(s.rt, relayOpts...)
	s.e2b = e2bapi.New(s.rt, e2bapi.Options{Token: s.token.value, Scope: s.tenancy.RequestPlacement,
		Watches: dispatcher.Watches(), Log: s.log.With().Str("component", "e2b").Logger(), StateDir: s.opts.StateDir})
	if s.opts.MCP {
		s.mcp = mcpserver.New(s.tenancy, mcpserver.Options{Version: s.opts.Version, Log: s.log.With().Str("component", "mcp").Logger()})
	}
	if s.ln != nil {
		s.http = &http.Server{Handler: s.guard.Wrap(s.routes()), ReadHeaderTimeout: 10 * time.Second}
	}
}

// codec returns the envelope of the protocol. A stdio server serves no
// /rpc/ws, so its LangBot codec always frames chunks as stdio does.
func (s *Server) codec() func() rpc.Codec {
	if s.opts.Protocol == LangBot {
		stdio := s.opts.Stdio
		return func() rpc.Codec { return rpc.NewLangBot(stdio) }
	}
	return func() rpc.Codec { return rpc.JSONRPC{} }
}
