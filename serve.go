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

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/relay"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
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
/metrics. Every route but the health checks needs the control token as
"Authorization: Bearer <token>". The token comes from --token-file,
BOXRT_CONTROL_TOKEN or LANGBOT_BOX_CONTROL_TOKEN. boxrt refuses to listen
on a non-loopback address without one; in --stdio mode without one it
generates a token and returns it as relay_token from box_health (over
stdio only).

Configuration (JSON/YAML file, or JSON in BOXRT_CONFIG / LANGBOT_BOX_CONFIG,
then box_init at run time), for example:
  {"backend": "auto", "limits": {"max_sessions": 64, "session_ttl_sec": 300},
   "local": {"allowed_mount_roots": ["/srv/boxrt"]}, "docker": {"image": "boxrt-sandbox:latest"}}`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "stdio", Usage: "serve JSON-RPC on stdin/stdout (the mode a host uses when it spawns boxrt)"},
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:5410", Usage: "HTTP listen address for /rpc/ws, the relay and health; port 0 picks a free port; '' turns the listener off"},
			&cli.StringFlag{Name: "token-file", Usage: "read the control token from this file (instead of BOXRT_CONTROL_TOKEN)"},
			&cli.StringFlag{Name: "config", Usage: "configuration file (JSON or YAML)"},
			&cli.StringFlag{Name: "state-dir", Value: defaultStateDir(), Usage: "where boxrt keeps its instance id and bwrap sessions"},
			&cli.StringFlag{Name: "log-format", Value: "json", Usage: "log format on stderr: json or console"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn, error"},
			&cli.BoolFlag{Name: "metrics-public", Usage: "serve /metrics without the control token"},
			&cli.DurationFlag{Name: "keepalive", Value: 20 * time.Second, Usage: "ping idle WebSocket peers (control and relay) this often; a peer that misses a pong for half as long is closed"},
		},
		Action: runServe,
	}
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

func newLogger(format, level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Logger{}, &exitError{code: 2, msg: fmt.Sprintf("--log-level %q: use debug, info, warn or error", level)}
	}
	var out = zerolog.New(os.Stderr)
	switch format {
	case "json":
	case "console":
		out = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.RFC3339})
	default:
		return zerolog.Logger{}, &exitError{code: 2, msg: fmt.Sprintf("--log-format %q: use json or console", format)}
	}
	return out.Level(lvl).With().Timestamp().Logger(), nil
}

// loadToken returns the control token and whether it was generated.
func loadToken(file string, stdio bool) (string, bool, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", false, &exitError{code: 2, msg: fmt.Sprintf("--token-file: %v", err)}
		}
		return checkToken("--token-file "+file, strings.TrimSpace(string(b)))
	}
	for _, env := range []string{"BOXRT_CONTROL_TOKEN", "LANGBOT_BOX_CONTROL_TOKEN"} {
		if tok := strings.TrimSpace(os.Getenv(env)); tok != "" {
			return checkToken(env, tok)
		}
	}
	if !stdio {
		return "", false, nil
	}
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return "", false, err
	}
	return base64.RawURLEncoding.EncodeToString(buf), true, nil
}

// minTokenLen is the reference's rule for control tokens.
const minTokenLen = 32

func checkToken(from, tok string) (string, bool, error) {
	if len(tok) < minTokenLen || strings.ContainsAny(tok, " \t\r\n") {
		return "", false, &exitError{code: 2, msg: fmt.Sprintf("%s: the control token must be at least %d characters without whitespace (e.g. openssl rand -base64 48)", from, minTokenLen)}
	}
	return tok, false, nil
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
		next, ignored, err := cfg.Merge(p.patch)
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
	log, err := newLogger(c.String("log-format"), c.String("log-level"))
	if err != nil {
		return err
	}
	stdio := c.Bool("stdio")
	listen := c.String("listen")
	token, generated, err := loadToken(c.String("token-file"), stdio)
	if err != nil {
		return err
	}
	if listen != "" && token == "" && !isLoopback(listen) {
		return &exitError{code: 2, msg: fmt.Sprintf("refusing to listen on %s without a control token: set BOXRT_CONTROL_TOKEN or --token-file, or listen on 127.0.0.1", listen)}
	}
	cfg, err := loadConfig(c.String("config"))
	if err != nil {
		return err
	}

	var ln net.Listener
	if listen != "" {
		ln, err = net.Listen("tcp", listen)
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
	// The skill store reads the live configuration (box_init may move its
	// root) through rt, and rt resolves skill mounts through the store.
	var rt *runtime.Runtime
	skillStore := actions.NewSkillStore(func() runtime.Config { return rt.Config() })
	defer skillStore.Close()
	rt, err = runtime.New(cfg, newBackend, c.String("state-dir"),
		runtime.WithLogger(log.With().Str("component", "runtime").Logger()),
		runtime.WithExecObserver(metrics.exec), runtime.WithSkillResolver(skillStore))
	if err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rt.Start(ctx)

	dispatcher := actions.New(rt, skillStore, actions.Server{
		Version:    buildVersion(),
		RelayURL:   func() string { return relayURL.Load().(string) },
		RelayToken: map[bool]string{true: token}[generated],
	})
	metrics.register(rt, dispatcher.Methods())
	rpcLog := log.With().Str("component", "rpc").Logger()
	keepalive := c.Duration("keepalive")
	server := rpc.NewServer(dispatcher,
		rpc.WithKeepalive(keepalive, keepalive/2),
		rpc.WithInline("__ping", "box_health", "box_get_backend_info"),
		rpc.WithErrorEncoder(actions.EncodeError),
		rpc.WithLogger(rpcLog),
		rpc.WithObserver(func(call rpc.Call) { logCall(rpcLog, call); metrics.observe(call) }),
	)
	auth := rpc.NewAuthenticator(token)
	relayHandler := relay.New(rt, relay.WithLogger(log.With().Str("component", "relay").Logger()),
		relay.WithObserver(metrics.relay), relay.WithKeepalive(keepalive, keepalive/2))

	var httpServer *http.Server
	if ln != nil {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"live": true, "version": buildVersion(), "uptime_sec": time.Since(rt.StartedAt()).Seconds()})
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			info := rt.BackendInfo()
			status := http.StatusOK
			if !info.Available {
				status = http.StatusServiceUnavailable
			}
			writeJSON(w, status, map[string]any{"ready": info.Available, "backend": info})
		})
		if !stdio {
			mux.Handle("GET /rpc/ws", auth.Require(server))
		}
		mux.Handle("GET /v1/sessions/{session_id}/managed-process/{process_id}/ws", auth.Require(relayHandler))
		mux.Handle("GET /v1/sessions/{session_id}/managed-process/ws", auth.Require(relayHandler))
		if c.Bool("metrics-public") {
			mux.Handle("GET /metrics", metrics.handler())
		} else {
			mux.Handle("GET /metrics", auth.Require(metrics.handler()))
		}
		httpServer = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := httpServer.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error().Err(err).Msg("http listener failed")
			}
		}()
	}
	log.Info().Str("version", buildVersion()).Bool("stdio", stdio).Str("listen", relayURL.Load().(string)).
		Bool("token_required", auth.Enabled()).Str("instance_id", rt.InstanceID()).Msg("boxrt serving")

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
	relayHandler.Close()
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
		ev = log.Info().Str("error_type", call.Err.Type).Str("error", truncate(call.Err.Message, 300))
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
