package server

import (
	"encoding/json"
	"net/http"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/internal/mcpserver"
	"github.com/boxrt/boxrt/relay"
	"github.com/boxrt/boxrt/runtime"
)

// routes is the HTTP listener's mux: health, /rpc/ws (unless stdio is the
// control channel), /mcp (boxrt mcp), the relay, the files endpoint, E2B's
// API and the metrics.
func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	// The health probes need no token, so they say nothing beyond
	// live/ready: version, backend and instance id are for token holders
	// (box_health, box_status).
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"live": true})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	switch {
	case s.opts.Stdio:
	case s.opts.Protocol == LangBot:
		mux.Handle("GET /rpc/ws", actions.RequireLangBotControl(s.rpc, s.opts.Token, s.opts.Trust, s.auth.Check))
	default:
		mux.Handle("GET /rpc/ws", s.auth.Require(s.rpc))
	}
	if s.mcp != nil {
		// MCP's Streamable HTTP (POST, GET and DELETE on one path): the
		// control token, as the control plane.
		mux.Handle(mcpserver.Path, s.auth.Require(s.mcp.HTTPHandler()))
	}
	// The relay checks its own credentials: the control token, or the
	// relay_token of the one process addressed.
	relayRoute := s.tenancy.AdmitRelay(s.relay, s.opts.Token)
	mux.Handle("GET /v1/sessions/{session_id}/managed-process/{process_id}/ws", relayRoute)
	mux.Handle("GET /v1/sessions/{session_id}/managed-process/ws", relayRoute)
	// A session's files, streamed (box_fs_* stop at a few MiB): the
	// control token only, as the control plane.
	files := s.auth.Require(relay.NewFiles(s.rt, s.log.With().Str("component", "files").Logger(), s.tenancy.RequestPlacement))
	for _, m := range []string{"GET", "PUT"} { // GET serves HEAD too
		mux.Handle(m+" "+runtime.FilesEndpoint, files)
	}
	// Exposed ports (box_expose_port): each exposure's own token, never
	// the control token.
	mux.Handle(relay.PortsRoute, relay.NewPorts(s.rt, s.log.With().Str("component", "ports").Logger(), s.tenancy.RequestPlacement, s.auth.Check))
	// E2B's API (control under /e2b, envd under /e2b/envd): the control
	// token as X-API-Key, each sandbox's own token for envd.
	s.e2b.Mount(mux)
	if s.opts.MetricsPublic {
		mux.Handle("GET /metrics", s.metrics.handler())
	} else {
		mux.Handle("GET /metrics", s.auth.Require(s.metrics.handler()))
	}
	return mux
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.tenancy.AdmissionRequired() {
		// The reference's readiness object, as LangBot's probes read it;
		// the backend's details and the error (paths) stay for token
		// holders (box_health).
		res := s.tenancy.Readiness(r.Context())
		res.Backend.Details, res.Error = nil, ""
		status := http.StatusOK
		if !res.Ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, res)
		return
	}
	ready := s.rt.BackendInfo().Available
	status := http.StatusOK
	if !ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, map[string]any{"ready": ready})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
