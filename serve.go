package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/clip"
	"github.com/boxrt/boxrt/internal/statelock"
	"github.com/boxrt/boxrt/relay"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/skills"
	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
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

Configuration (JSON/YAML file, or JSON in BOXRT_CONFIG / LANGBOT_BOX_CONFIG,
then box_init at run time), for example:
  {"backend": "auto", "limits": {"max_sessions": 64, "session_ttl_sec": 300},
   "local": {"allowed_mount_roots": ["/srv/boxrt"]}, "docker": {"image": "boxrt-sandbox:latest"}}`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "stdio", Usage: "serve JSON-RPC on stdin/stdout (the mode a host uses when it spawns boxrt)"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:5410", Usage: "HTTP listen address for /rpc/ws, the relay and health; port 0 picks a free port; '' turns the listener off"},
			&cli.StringFlag{Name: "token-file", Usage: "read the control token from this file (instead of BOXRT_CONTROL_TOKEN)"},
			&cli.StringFlag{Name: "config", Usage: "configuration file (JSON or YAML)"},
			&cli.StringFlag{Name: "state-dir", Value: defaultStateDir(), Usage: "where boxrt keeps its instance id and bwrap sessions; one runtime per directory (it is locked while boxrt runs)"},
			&cli.StringFlag{Name: "private-state-dir", EnvVars: []string{"BOXRT_PRIVATE_STATE_DIR"}, Usage: "a state directory private to this run, which the spawner removes afterwards: every session ends when boxrt exits, persistent and suspended ones too (boxrt call --spawn and reconnect.Spawn set it; --state-dir wins over it)"},
			&cli.StringFlag{Name: "log-format", Value: "json", Usage: "log format on stderr: json or console"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn, error"},
			&cli.BoolFlag{Name: "metrics-public", Usage: "serve /metrics without the control token"},
			&cli.StringSliceFlag{Name: "allowed-hosts", EnvVars: []string{"BOXRT_ALLOWED_HOSTS"}, Usage: "more host names or IPs clients may use in Host and Origin headers (comma-separated), e.g. the name a reverse proxy forwards"},
			&cli.DurationFlag{Name: "keepalive", Value: 20 * time.Second, Usage: "ping idle WebSocket peers (control and relay) this often; a peer that misses a pong for half as long is closed"},
			&cli.StringFlag{Name: "protocol", Value: protocolJSONRPC, Usage: "envelope of stdio and /rpc/ws: jsonrpc (JSON-RPC 2.0) or langbot (LangBot's action RPC; see boxrt box)"},
		},
		Action: runServe,
	}
}

// stateDirOf is the state directory serve uses, and whether it is a
// private one (--private-state-dir, unless --state-dir is given).
func stateDirOf(c *cli.Context) (dir string, private bool) {
	if p := c.String("private-state-dir"); p != "" && !c.IsSet("state-dir") {
		return p, true
	}
	return c.String("state-dir"), false
}

func defaultStateDir() string {
	if d := os.Getenv("BOXRT_STATE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/boxrt"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "boxrt")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "boxrt")
	}
	return filepath.Join(os.TempDir(), "boxrt")
}

// newLogger returns the logger on stderr (through a logSink, so logging
// never blocks) and the sink, which the caller closes at shutdown.
func newLogger(format, level string) (zerolog.Logger, *logSink, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, nil, &exitError{code: 2, msg: fmt.Sprintf("--log-level %q: use debug, info, warn or error", level)}
	}
	switch format {
	case "json", "console":
	default:
		return zerolog.Logger{}, nil, &exitError{code: 2, msg: fmt.Sprintf("--log-format %q: use json or console", format)}
	}
	sink, log := newLogSink(os.Stderr, format, lvl)
	return log, sink, nil
}

// relayDrainTimeout bounds waiting at shutdown for relay peers to answer
// the close; a close handshake is one round trip.
const relayDrainTimeout = time.Second

// controlTokenFileName is the file in the state directory that holds the
// control token boxrt generated for a --listen runtime.
const controlTokenFileName = "control-token"

// controlToken is the token every authenticated route checks.
type controlToken struct {
	value string
	// generated: boxrt made it up (nobody configured one).
	generated bool
	// file holds a generated token of a --listen runtime; "" otherwise.
	file string
}

// configuredToken returns the control token from --token-file or the
// environment; its value is "" when none is configured.
func configuredToken(file string) (controlToken, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return controlToken{}, &exitError{code: 2, msg: fmt.Sprintf("--token-file: %v", err)}
		}
		return checkToken("--token-file "+file, strings.TrimSpace(string(b)))
	}
	for _, env := range []string{"BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"} {
		if tok := strings.TrimSpace(os.Getenv(env)); tok != "" {
			return checkToken(env, tok)
		}
	}
	return controlToken{}, nil
}

// generateToken makes up the control token when none is configured: in
// stdio mode a fresh one the host learns over stdio; otherwise the one kept
// in the state directory, created there when missing, so a developer's
// client keeps working across restarts.
func generateToken(stdio bool, stateDir string) (controlToken, error) {
	if stdio {
		tok, err := randomToken()
		return controlToken{value: tok, generated: true}, err
	}
	path := filepath.Join(stateDir, controlTokenFileName)
	if tok, err := readTokenFile(path, true); err == nil {
		return controlToken{value: tok, generated: true, file: path}, nil
	}
	tok, err := randomToken()
	if err != nil {
		return controlToken{}, err
	}
	if err := writeTokenFile(path, tok); err != nil {
		return controlToken{}, &exitError{code: 2, msg: fmt.Sprintf("cannot keep the generated control token in %s: %v (set BOXRT_CONTROL_TOKEN or --token-file instead)", path, err)}
	}
	return controlToken{value: tok, generated: true, file: path}, nil
}

func randomToken() (string, error) {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(buf), nil
}

// readTokenFile reads a generated token file. private refuses a file that
// is not a regular file only its owner can read: such a token may be known
// to others and is replaced rather than reused.
func readTokenFile(path string, private bool) (string, error) {
	if private {
		fi, err := os.Lstat(path)
		if err != nil {
			return "", err
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("%s is not a private regular file", path)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if _, err := checkToken(path, tok); err != nil {
		return "", err
	}
	return tok, nil
}

// writeTokenFile writes tok to path with mode 0600 through a temp file and
// a rename, so a crash never leaves a half-written token behind.
func writeTokenFile(path, tok string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+controlTokenFileName+"-*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(tok + "\n")
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// minTokenLen is the shortest control token boxrt accepts, counted in
// characters. The token is a bearer credential that guards command
// execution in every session, so a guessable one is refused at start
// rather than warned about (the reference runtime has the same rule).
const minTokenLen = 32

// checkToken validates a configured token; from names its source (the
// flag with its file, or the environment variable) so the error says
// which setting to fix.
func checkToken(from, tok string) (controlToken, error) {
	if strings.ContainsAny(tok, " \t\r\n") {
		return controlToken{}, &exitError{code: 2, msg: fmt.Sprintf("%s: the control token must not contain whitespace", from)}
	}
	if n := utf8.RuneCountInString(tok); n < minTokenLen {
		return controlToken{}, &exitError{code: 2, msg: fmt.Sprintf("%s: the control token is %d characters long; it must be at least %d (generate one with: openssl rand -base64 48)", from, n, minTokenLen)}
	}
	return controlToken{value: tok}, nil
}

func loadConfig(file string) (runtime.Config, error) {
	cfg := runtime.DefaultConfig()
	var patches []struct {
		from  string
		patch json.RawMessage
	}
	if file != "" {
		p, err := runtime.LoadFile(file)
		if err != nil {
			return cfg, &exitError{code: 2, msg: err.Error()}
		}
		patches = append(patches, struct {
			from  string
			patch json.RawMessage
		}{"--config " + file, p})
	}
	for _, env := range []string{"LANGBOT_BOX_CONFIG", "BOXRT_CONFIG"} {
		if v := strings.TrimSpace(os.Getenv(env)); v != "" {
			patches = append(patches, struct {
				from  string
				patch json.RawMessage
			}{env, json.RawMessage(v)})
		}
	}
	for _, p := range patches {
		// The host's backend names (nsjail, e2b, host) become boxrt's.
		patch, _, err := actions.TranslateLangBotConfig(p.patch)
		if err != nil {
			return cfg, &exitError{code: 2, msg: fmt.Sprintf("%s: %v", p.from, err)}
		}
		if p.from == "LANGBOT_BOX_CONFIG" {
			// The host's default mount roots hold its skill store.
			var notes []string
			patch, notes = actions.FitLangBotMountRoots(cfg, patch)
			for _, n := range notes {
				fmt.Fprintf(os.Stderr, "boxrt: LANGBOT_BOX_CONFIG: %s\n", n)
			}
		}
		next, ignored, err := cfg.Merge(patch, actions.DecodeParams)
		if err != nil {
			return cfg, &exitError{code: 2, msg: fmt.Sprintf("%s: %v", p.from, err)}
		}
		if len(ignored) > 0 {
			fmt.Fprintf(os.Stderr, "boxrt: %s: ignoring keys boxrt does not use: %s\n", p.from, strings.Join(ignored, ", "))
		}
		cfg = next
	}
	return cfg, nil
}

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

func runServe(c *cli.Context) error {
	log, sink, err := newLogger(c.String("log-format"), c.String("log-level"))
	if err != nil {
		return err
	}
	// Deferred first, so it runs last: every line logged during shutdown
	// is written out unless stderr is stuck, and then only briefly waited
	// for.
	defer sink.Close(2 * time.Second)
	sink.captureStdlog(log)
	if was := ensureProcs(); was != 0 {
		log.Info().Int("was", was).Int("gomaxprocs", minProcs).Msg("one CPU available: GOMAXPROCS raised so a read waiting on the connection keeps its P (set GOMAXPROCS to choose)")
	}
	stdio := c.Bool("stdio")
	listen := c.String("listen")
	token, err := configuredToken(c.String("token-file"))
	if err != nil {
		return err
	}
	if listen != "" && token.value == "" && !isLoopback(listen) {
		return &exitError{code: 2, msg: fmt.Sprintf("refusing to listen on %s without a control token: set BOXRT_CONTROL_TOKEN or --token-file, or listen on 127.0.0.1", listen)}
	}
	cfg, err := loadConfig(c.String("config"))
	if err != nil {
		return err
	}
	protocol := c.String("protocol")
	newCodec, err := codecFor(protocol, stdio)
	if err != nil {
		return err
	}
	if protocol == protocolLangBot && !stdio && token.value == "" && cfg.Backend == actions.HostBackend {
		return &exitError{code: 2, msg: actions.ErrOpenHostBackend().Error()}
	}
	trust, err := trustedInstance(protocol, stdio)
	if err != nil {
		return err
	}
	// The token the host configured (the LangBot header must carry it);
	// "" when boxrt generates one below.
	configuredControlToken := token.value

	stateDir, private := stateDirOf(c)
	// Held until the process exits: the sessions labelled with this
	// directory's instance id are this process's alone.
	stateLock, err := statelock.Acquire(stateDir)
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	defer stateLock.Release()

	if token.value == "" {
		if token, err = generateToken(stdio, stateDir); err != nil {
			return err
		}
	}
	if token.file != "" {
		// Where, never what: the token itself is not logged.
		fmt.Fprintf(os.Stderr, "boxrt: no control token configured; using the generated one in %s (clients send \"Authorization: Bearer $(cat %s)\"; boxrt call --url reads it itself)\n", token.file, token.file)
	}
	var ln net.Listener
	var guard *rpc.HostGuard
	if listen != "" {
		guard, err = rpc.NewHostGuard(listen, c.StringSlice("allowed-hosts"))
		if err != nil {
			return &exitError{code: 2, msg: fmt.Sprintf("--listen: %v", err)}
		}
		ln, err = net.Listen("tcp", listen)
		if err != nil && stdio && protocol == protocolLangBot {
			// As the reference: a LangBot host that respawns its stdio
			// child must not lose the action RPC to a port still held;
			// only the relay and health are missing.
			log.Warn().Err(err).Str("listen", listen).Msg("cannot listen; serving stdio without the relay")
			ln, err = nil, nil
		}
		if err != nil {
			return &exitError{code: 2, msg: fmt.Sprintf("cannot listen on %s: %v (use --listen 127.0.0.1:0 for a free port, or --listen '' for none)", listen, err)}
		}
	}
	var relayURL atomic.Value
	relayURL.Store("")
	if ln != nil {
		relayURL.Store("http://" + ln.Addr().String())
	}

	metrics := newMetrics()
	metrics.logDrops(sink.Dropped)
	// The skill store reads the live configuration (box_init may move its
	// root) through rt, and rt resolves skill mounts through the store; the
	// store opens (and clears leftovers) before rt exists, on the start-up
	// configuration.
	var rt *runtime.Runtime
	skillStore := actions.NewSkillStore(func() runtime.Config {
		if rt == nil {
			return cfg
		}
		return rt.Config()
	})
	defer skillStore.Close()
	rt, err = runtime.New(cfg, newBackend, stateDir, runtimeOptions(log, metrics.exec, skillStore, private)...)
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rt.Start(ctx)
	go newBurstReleaser().run(ctx, memoryCheckEvery, log.With().Str("component", "memory").Logger())

	// Only a token boxrt made up for this stdio session goes back to the
	// host; a configured one is the host's already.
	var relayToken string
	if token.generated && stdio {
		relayToken = token.value
	}
	dispatcher := actions.New(rt, skillStore, actions.Server{
		Version:    buildVersion(),
		RelayURL:   func() string { return relayURL.Load().(string) },
		RelayToken: relayToken,
	})
	langbot := protocol == protocolLangBot
	tenancy := actions.NewTenancy(dispatcher, trust, actions.TenancyOptions{Required: langbot, LangBot: langbot,
		OpenWebSocket: langbot && !stdio && configuredControlToken == "", Log: log.With().Str("component", "tenancy").Logger()})
	tenancy.ApplyStartupConfig(os.Getenv("LANGBOT_BOX_CONFIG"))
	metrics.register(rt, tenancy.Methods())
	rpcLog := log.With().Str("component", "rpc").Logger()
	keepalive := c.Duration("keepalive")
	server := rpc.NewServer(tenancy,
		rpc.WithCodec(newCodec),
		rpc.WithKeepalive(keepalive, keepalive/2),
		rpc.WithInline("__ping", "box_health", "box_get_backend_info"),
		rpc.WithErrorEncoder(actions.EncodeError),
		rpc.WithLogger(rpcLog),
		rpc.WithObserver(func(call rpc.Call) { logCall(rpcLog, call); metrics.observe(call) }),
	)
	auth := rpc.NewAuthenticator(token.value)
	relayOpts := []relay.Option{relay.WithOperator(auth), relay.WithLogger(log.With().Str("component", "relay").Logger()),
		relay.WithObserver(metrics.relay), relay.WithKeepalive(keepalive, keepalive/2),
		relay.WithAuthorizer(tenancy.RelayAuthorizer(configuredControlToken)), relay.WithScope(tenancy.RequestPlacement)}
	if langbot {
		relayOpts = append(relayOpts, relay.WithMaxFrame(langbotMaxRelayFrame))
	}
	relayHandler := relay.New(rt, relayOpts...)

	var httpServer *http.Server
	if ln != nil {
		mux := http.NewServeMux()
		// The health probes need no token, so they say nothing beyond
		// live/ready: version, backend and instance id are for token
		// holders (box_health, box_status).
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"live": true})
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
			if tenancy.AdmissionRequired() {
				// The reference's readiness object, as LangBot's probes
				// read it; the backend's details and the error (paths) stay
				// for token holders (box_health).
				res := tenancy.Readiness(r.Context())
				res.Backend.Details, res.Error = nil, ""
				status := http.StatusOK
				if !res.Ready {
					status = http.StatusServiceUnavailable
				}
				writeJSON(w, status, res)
				return
			}
			ready := rt.BackendInfo().Available
			status := http.StatusOK
			if !ready {
				status = http.StatusServiceUnavailable
			}
			writeJSON(w, status, map[string]any{"ready": ready})
		})
		switch {
		case stdio:
		case langbot:
			mux.Handle("GET /rpc/ws", actions.RequireLangBotControl(server, configuredControlToken, trust, auth.Check))
		default:
			mux.Handle("GET /rpc/ws", auth.Require(server))
		}
		// The relay checks its own credentials: the control token, or the
		// relay_token of the one process addressed.
		relayRoute := tenancy.AdmitRelay(relayHandler, configuredControlToken)
		mux.Handle("GET /v1/sessions/{session_id}/managed-process/{process_id}/ws", relayRoute)
		mux.Handle("GET /v1/sessions/{session_id}/managed-process/ws", relayRoute)
		// A session's files, streamed (box_fs_* stop at a few MiB): the
		// control token only, as the control plane.
		files := auth.Require(relay.NewFiles(rt, log.With().Str("component", "files").Logger(), tenancy.RequestPlacement))
		for _, m := range []string{"GET", "PUT"} { // GET serves HEAD too
			mux.Handle(m+" "+runtime.FilesEndpoint, files)
		}
		if c.Bool("metrics-public") {
			mux.Handle("GET /metrics", metrics.handler())
		} else {
			mux.Handle("GET /metrics", auth.Require(metrics.handler()))
		}
		httpServer = &http.Server{Handler: guard.Wrap(mux), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := httpServer.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error().Err(err).Msg("http listener failed")
			}
		}()
	}
	log.Info().Str("version", buildVersion()).Bool("stdio", stdio).Str("protocol", protocol).Str("listen", relayURL.Load().(string)).
		Str("token_file", token.file).Str("instance_id", rt.InstanceID()).Msg("boxrt serving")

	if stdio {
		done := make(chan struct{})
		go func() {
			server.ServeStdio(ctx, os.Stdin, os.Stdout)
			close(done)
		}()
		select {
		case <-done:
			log.Info().Msg("stdin closed; shutting down")
		case <-ctx.Done():
			log.Info().Msg("signal received; shutting down")
		}
	} else {
		<-ctx.Done()
		log.Info().Msg("signal received; shutting down")
	}

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	// The relay is drained before the runtime stops the processes it
	// bridges. It gets a slice of the budget only: a peer that does not
	// answer the close must not leave rt.Close no time to destroy sessions.
	relayCtx, cancelRelay := context.WithTimeout(shutdownCtx, relayDrainTimeout)
	if err := relayHandler.Close(relayCtx); err != nil {
		log.Warn().Err(err).Msg("relay sockets cut at shutdown: peers did not answer the close")
	}
	cancelRelay()
	server.Close(shutdownCtx)
	if httpServer != nil {
		_ = httpServer.Shutdown(shutdownCtx)
	}
	if err := rt.Close(shutdownCtx); err != nil {
		log.Warn().Err(err).Msg("shutdown left errors")
	}
	log.Info().Msg("boxrt stopped")
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// logCall logs one answered request: method, id, session and process ids,
// duration, error type. Params are never logged, only those two ids. The
// heartbeat logs at debug so it does not drown the rest.
func logCall(log zerolog.Logger, call rpc.Call) {
	var ev *zerolog.Event
	switch {
	case call.Err != nil:
		ev = log.Info().Str("error_type", call.Err.Type).Str("error", clip.String(call.Err.Message, 300))
	case call.Method == "__ping":
		ev = log.Debug() // decided before an Info event is built: this runs for every heartbeat
	default:
		ev = log.Info()
	}
	if !ev.Enabled() {
		return
	}
	if ids := callIDs(call.Params); ids.SessionID != "" {
		ev = ev.Str("session_id", ids.SessionID)
		if ids.ProcessID != "" {
			ev = ev.Str("process_id", ids.ProcessID)
		}
	}
	ev.Str("method", call.Method).RawJSON("request_id", call.ID).Str("transport", call.Transport).
		Float64("duration_ms", float64(call.Duration.Microseconds())/1000).Msg("rpc")
}

type callIdentifiers struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
	Spec      struct {
		ProcessID string `json:"process_id"`
	} `json:"spec"`
}

// callIDs reads the session and process ids of a request for its log line;
// large params (zip uploads) are not decoded again.
func callIDs(params json.RawMessage) callIdentifiers {
	var ids callIdentifiers
	if len(params) == 0 || len(params) > 64<<10 || json.Unmarshal(params, &ids) != nil {
		return callIdentifiers{}
	}
	if ids.ProcessID == "" {
		ids.ProcessID = ids.Spec.ProcessID
	}
	return ids
}

// runtimeOptions are the runtime's options in serve: its log, the exec
// metrics, skills from the store (per Workspace scope), and with a
// private state directory sessions that all end with the process.
func runtimeOptions(log zerolog.Logger, observe func(runtime.ExecEvent), store *skills.Store, private bool) []runtime.Option {
	opts := []runtime.Option{runtime.WithLogger(log.With().Str("component", "runtime").Logger()),
		runtime.WithExecObserver(observe), runtime.WithSkillResolver(skills.ContextResolver{Base: store})}
	if private {
		opts = append(opts, runtime.WithSessionsEndingAtClose())
	}
	return opts
}
