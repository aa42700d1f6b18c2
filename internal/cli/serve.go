package cli

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/controltoken"
	"github.com/boxrt/boxrt/internal/dialout"
	"github.com/boxrt/boxrt/internal/logsink"
	"github.com/boxrt/boxrt/internal/server"
	"github.com/boxrt/boxrt/reconnect"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "run the runtime (JSON-RPC over stdio or WebSocket)",
		Description: `Serves JSON-RPC 2.0. With --stdio the host talks over this process's
stdin/stdout (one JSON object per line; nothing else is ever written to
stdout; logs go to stderr) and EOF on stdin shuts boxrt down. Otherwise
clients connect to ws://ADDR/rpc/ws.

The HTTP listener (--listen) also serves the managed-process relay
(/v1/sessions/{id}/managed-process/{pid}/ws), /healthz, /readyz and
/metrics. Every route but the health checks needs a token as
"Authorization: Bearer <token>": the control token, or on a relay route
that process's relay_token. The control token comes from --token-file,
BOXRT_CONTROL_TOKEN or LANGBOT_BOX_CONTROL_TOKEN. Without one boxrt
generates it: with --stdio it is returned as relay_token from box_health
(over stdio only); otherwise it is kept in STATE_DIR/control-token (0600,
reused on the next start) and "boxrt call" finds it there. boxrt refuses to
listen on a non-loopback address without a configured token. A configured
token must be at least 32 characters without whitespace (boxrt exits 2
otherwise). Every route
refuses a Host or Origin header naming another host than the listener's
(loopback names on a loopback listener; add names with --allowed-hosts).

With --connect wss://HOST/PATH boxrt dials its host instead of being
dialled, for a sandbox machine behind NAT or a firewall: the host is the
WebSocket server, boxrt the client, and the same JSON-RPC flows over that
connection; the relay and the files endpoint travel as streams inside it,
so nothing listens (no --listen unless asked for). The control token
(--token-file or BOXRT_CONTROL_TOKEN, required; never in the URL, which is
refused if it carries one) is sent as "Authorization: Bearer". boxrt pings
the host every --keepalive, redials with backoff (1 s doubling to 30 s,
±20 % jitter) and resumes: sessions and running execs outlive a dropped
connection, and answers made meanwhile are delivered when it is back
(docs/protocol.md, "Dial-out runtimes").

Configuration (JSON/YAML file, or JSON in BOXRT_CONFIG / LANGBOT_BOX_CONFIG,
then box_init at run time), for example:
  {"backend": "auto", "limits": {"max_sessions": 64, "session_ttl_sec": 300},
   "local": {"allowed_mount_roots": ["/srv/boxrt"]}, "docker": {"image": "boxrt-sandbox:latest"}}`,
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "stdio", Usage: "serve JSON-RPC on stdin/stdout (the mode a host uses when it spawns boxrt)"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:5410", Usage: "HTTP listen address for /rpc/ws, the relay and health; port 0 picks a free port; '' turns the listener off; with --stdio the default is " + stdioListen + " (a free port, told in box_health's relay_url)"},
			&cli.StringFlag{Name: "connect", Usage: "dial the host at this wss:// URL (ws:// to a loopback host) and serve over that connection instead of listening; the token comes from --token-file or BOXRT_CONTROL_TOKEN, never from the URL"},
			&cli.StringFlag{Name: "protocol", Value: string(server.JSONRPC), Usage: "envelope of stdio and /rpc/ws: jsonrpc (JSON-RPC 2.0) or langbot (LangBot's action RPC; see boxrt box)"},
		}, runtimeFlags()...),
		Action: noArgs("serve", runServe),
	}
}

// runtimeFlags are the flags of every command that runs the runtime (serve,
// mcp): its configuration, state directory, token, logs and listener.
func runtimeFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "token-file", Usage: "read the control token from this file (instead of BOXRT_CONTROL_TOKEN)"},
		&cli.StringFlag{Name: "config", Usage: "configuration file (JSON or YAML)"},
		&cli.StringFlag{Name: "state-dir", Value: reconnect.DefaultStateDir(), Usage: "where boxrt keeps its instance id, bwrap sessions and skill store (STATE_DIR/skills, unless local.host_root or an absolute local.skills_root says otherwise); one runtime per directory (it is locked while boxrt runs)"},
		&cli.StringFlag{Name: "private-state-dir", EnvVars: []string{"BOXRT_PRIVATE_STATE_DIR"}, Usage: "a state directory private to this run, which the spawner removes afterwards: every session ends when boxrt exits, persistent and suspended ones too (boxrt call --spawn and reconnect.Spawn set it; --state-dir wins over it)"},
		&cli.StringFlag{Name: "log-format", Value: "json", Usage: "log format on stderr: json or console (coloured only on a terminal)"},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn, error"},
		&cli.BoolFlag{Name: "metrics-public", Usage: "serve /metrics without the control token"},
		&cli.StringSliceFlag{Name: "allowed-hosts", EnvVars: []string{"BOXRT_ALLOWED_HOSTS"}, Usage: "more host names or IPs clients may use in Host and Origin headers (comma-separated), e.g. the name a reverse proxy forwards"},
		&cli.DurationFlag{Name: "keepalive", Value: 20 * time.Second, Usage: "ping idle WebSocket peers (control and relay; with --connect, the host) this often; a peer that misses a pong for half as long is closed"},
	}
}

// shutdownTimeout bounds serve's shutdown: the relay's drain, the
// connections and the runtime destroying what must end with it.
const shutdownTimeout = 4 * time.Second

// stdioListen is --stdio's listener unless --listen names one: a host
// spawns stdio runtimes next to a serving one and to each other, so the
// default port would be taken, yet the relay and the files endpoint need a
// listener.
const stdioListen = "127.0.0.1:0"

func runServe(c *cli.Context) error { return runServer(c, serveOptions) }

// runServer runs the runtime options reads from c's flags until a signal
// or, on stdio, the end of stdin.
func runServer(c *cli.Context, options func(*cli.Context) (server.Options, error)) error {
	log, sink, err := newLogger(c.String("log-format"), c.String("log-level"))
	if err != nil {
		return err
	}
	// Deferred first, so it runs last: every line logged during shutdown
	// is written out unless stderr is stuck, and then only briefly waited
	// for.
	defer sink.Close(2 * time.Second)
	sink.CaptureStdlog(log)
	opts, err := options(c)
	if err != nil {
		return err
	}
	opts.Log, opts.LogDropped = log, sink.Dropped
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := server.New(ctx, opts)
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	srv.Run(ctx)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Close(shutdownCtx); err != nil {
		log.Warn().Err(err).Msg("shutdown left errors")
	}
	log.Info().Msg("boxrt stopped")
	return nil
}

// serveOptions reads serve's flags and environment and refuses
// combinations that would serve unprotected, in the order an operator
// fixes them: the token, the address, the configuration, the protocol.
func serveOptions(c *cli.Context) (server.Options, error) {
	stdio, listen := c.Bool("stdio"), c.String("listen")
	if stdio && !c.IsSet("listen") {
		listen = stdioListen
	}
	connect, err := connectURL(c, stdio)
	if err != nil {
		return server.Options{}, err
	}
	if connect != "" && !c.IsSet("listen") {
		listen = ""
	}
	protocol := server.Protocol(c.String("protocol"))
	if protocol != server.JSONRPC && connect != "" {
		return server.Options{}, &exitError{code: 2, msg: "--connect serves JSON-RPC only: drop --protocol " + string(protocol)}
	}
	opts, err := runtimeOptions(c, stdio, listen, protocol)
	if err != nil {
		return opts, err
	}
	if connect != "" && opts.Token == "" {
		return server.Options{}, &exitError{code: 2, msg: "--connect needs a control token to present to the host: set --token-file or BOXRT_CONTROL_TOKEN"}
	}
	opts.Connect = connect
	return opts, nil
}

// runtimeOptions reads the flags and environment of runtimeFlags for a
// runtime serving protocol on stdio and/or listen.
func runtimeOptions(c *cli.Context, stdio bool, listen string, protocol server.Protocol) (server.Options, error) {
	token, err := configuredToken(c.String("token-file"))
	if err != nil {
		return server.Options{}, err
	}
	if listen != "" && token == "" && !isLoopback(listen) {
		return server.Options{}, &exitError{code: 2, msg: fmt.Sprintf("refusing to listen on %s without a control token: set BOXRT_CONTROL_TOKEN or --token-file, or listen on 127.0.0.1", listen)}
	}
	stateDir, private := stateDirOf(c)
	cfg, err := loadConfig(c.String("config"), stateDir)
	if err != nil {
		return server.Options{}, err
	}
	if protocol != server.JSONRPC && protocol != server.LangBot {
		return server.Options{}, &exitError{code: 2, msg: fmt.Sprintf("--protocol %q: use jsonrpc or langbot", protocol)}
	}
	if protocol == server.LangBot && !stdio && token == "" && cfg.Backend == actions.HostBackend {
		return server.Options{}, &exitError{code: 2, msg: actions.ErrOpenHostBackend().Error()}
	}
	trust, err := trustedInstance(protocol, stdio)
	if err != nil {
		return server.Options{}, err
	}
	return server.Options{
		Version: c.App.Version, Config: cfg, StateDir: stateDir, PrivateStateDir: private,
		Token: token, Listen: listen, AllowedHosts: c.StringSlice("allowed-hosts"), MetricsPublic: c.Bool("metrics-public"),
		Protocol: protocol, Stdio: stdio, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		Trust: trust, LangBotConfig: os.Getenv("LANGBOT_BOX_CONFIG"), Keepalive: c.Duration("keepalive"),
	}, nil
}

// connectURL is --connect, checked: a URL carrying a token is refused
// before anything else, and --stdio has its own peer.
func connectURL(c *cli.Context, stdio bool) (string, error) {
	raw := c.String("connect")
	if raw == "" {
		return "", nil
	}
	u, err := dialout.CheckURL(raw)
	if err != nil {
		return "", &exitError{code: 2, msg: err.Error()}
	}
	if stdio {
		return "", &exitError{code: 2, msg: "--connect and --stdio each name the host's channel: use one"}
	}
	return u, nil
}

// stateDirOf is the state directory serve uses, and whether it is a
// private one (--private-state-dir, unless --state-dir is given).
func stateDirOf(c *cli.Context) (dir string, private bool) {
	if p := c.String("private-state-dir"); p != "" && !c.IsSet("state-dir") {
		return p, true
	}
	return c.String("state-dir"), false
}

// newLogger returns the logger on stderr (through a logsink.Sink, so
// logging never blocks) and the sink, which the caller closes at shutdown.
func newLogger(format, level string) (zerolog.Logger, *logsink.Sink, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, nil, &exitError{code: 2, msg: fmt.Sprintf("--log-level %q: use debug, info, warn or error", level)}
	}
	switch format {
	case "json", "console":
	default:
		return zerolog.Logger{}, nil, &exitError{code: 2, msg: fmt.Sprintf("--log-format %q: use json or console", format)}
	}
	sink, log := logsink.New(os.Stderr, format, lvl)
	return log, sink, nil
}

// configuredToken returns the control token from --token-file or the
// environment; "" when none is configured.
func configuredToken(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", &exitError{code: 2, msg: fmt.Sprintf("--token-file: %v", err)}
		}
		return checkedToken("--token-file "+file, strings.TrimSpace(string(b)))
	}
	for _, env := range []string{"BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"} {
		if tok := strings.TrimSpace(os.Getenv(env)); tok != "" {
			return checkedToken(env, tok)
		}
	}
	return "", nil
}

// checkedToken refuses a configured token that is too weak; from names
// the setting to fix.
func checkedToken(from, tok string) (string, error) {
	if err := controltoken.Check(from, tok); err != nil {
		return "", &exitError{code: 2, msg: err.Error()}
	}
	return tok, nil
}

// trustedInstance reads LANGBOT_BOX_TRUSTED_INSTANCE_UUID: required for
// the LangBot protocol on stdio (nothing else names the host's instance
// there), optional otherwise (the first /rpc/ws connection pins it).
func trustedInstance(protocol server.Protocol, stdio bool) (*actions.Trust, error) {
	id := strings.TrimSpace(os.Getenv("LANGBOT_BOX_TRUSTED_INSTANCE_UUID"))
	langbot := protocol == server.LangBot
	switch {
	case id == "" && langbot && stdio:
		return nil, &exitError{code: 2, msg: "LANGBOT_BOX_TRUSTED_INSTANCE_UUID is required with -s (the LangBot host sets it when it spawns the runtime)"}
	case id != "" && !actions.InstanceIDPattern.MatchString(id):
		return nil, &exitError{code: 2, msg: fmt.Sprintf("LANGBOT_BOX_TRUSTED_INSTANCE_UUID %q must match %s", id, actions.InstanceIDPattern)}
	}
	// JSON-RPC clients have no control header naming the instance: their
	// first tenant context pins it.
	return actions.NewTrust(id, !langbot), nil
}

// isLoopback reports whether addr (host:port) names this machine by a
// loopback name or address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
