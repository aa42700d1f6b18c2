package e2bapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// maxBody bounds a control request's JSON body.
const maxBody = 1 << 20

// mountControl registers the sandbox routes under Prefix.
func (h *Handler) mountControl(mux *http.ServeMux) {
	routes := map[string]func(http.ResponseWriter, *http.Request){
		"POST /sandboxes":                 h.create,
		"POST /v2/sandboxes":              h.create,
		"GET /sandboxes":                  h.list,
		"GET /v2/sandboxes":               h.list,
		"GET /sandboxes/{id}":             h.get,
		"DELETE /sandboxes/{id}":          h.kill,
		"POST /sandboxes/{id}/timeout":    h.setTimeout,
		"POST /sandboxes/{id}/pause":      h.pause,
		"POST /sandboxes/{id}/resume":     h.resume,
		"POST /sandboxes/{id}/connect":    h.connect,
		"POST /v2/sandboxes/{id}/connect": h.connect,
		"GET /sandboxes/{id}/metrics":     h.metrics,
		"GET /sandboxes/metrics":          h.metricsOf,
		"GET /sandboxes/{id}/logs":        notImplemented("sandbox logs"),
		"GET /v2/sandboxes/{id}/logs":     notImplemented("sandbox logs"),
		"POST /sandboxes/{id}/fork":       h.fork,
		"POST /sandboxes/{id}/snapshots":  h.snapshot,
		"GET /snapshots":                  h.listSnapshots,
		"PUT /sandboxes/{id}/network":     h.updateNetwork,
		"POST /sandboxes/{id}/refreshes":  h.refresh,
	}
	for pattern, fn := range routes {
		method, path, _ := strings.Cut(pattern, " ")
		mux.Handle(method+" "+Prefix+path, h.control(fn))
	}
	// Anything else under the prefix answers in E2B's shape, never the
	// mux's plain text.
	mux.Handle(Prefix+"/", h.control(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s %s is not part of the E2B API boxrt serves", r.Method, r.URL.Path))
	}))
}

func notImplemented(what string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotImplemented, what+" is not implemented by boxrt's E2B API (see docs/protocol.md, E2B API)")
	}
}

// newSandbox is the create body (NewSandbox); members boxrt does not
// serve (network, mcp, volume mounts, auto-pause) are ignored.
type newSandbox struct {
	TemplateID string            `json:"templateID"`
	AutoPause  bool              `json:"autoPause"`
	Timeout    *int              `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	// Egress: see policyOf.
	Network             *e2bNetwork `json:"network"`
	AllowInternetAccess *bool       `json:"allow_internet_access"`
}

// sandboxJSON is the Sandbox schema: what create, resume and connect
// answer.
type sandboxJSON struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	Alias           string  `json:"alias,omitempty"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
}

// detailJSON is SandboxDetail and ListedSandbox (the list leaves out the
// access token).
type detailJSON struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the body is not the JSON object expected: %v", err)
	}
	return nil
}

// templateImage maps an E2B template to an image: the configuration's
// e2b.templates names them; "base", unless named there, is the default
// image.
func (h *Handler) templateImage(template string) (string, bool) {
	templates, _ := h.rt.Config().E2B["templates"].(map[string]any)
	if image, ok := templates[template].(string); ok && image != "" {
		return image, true
	}
	return "", template == "base"
}

// newSandboxID is a fresh sandbox (session) id.
func newSandboxID() string { return "i" + randomHex(10) }

func timeoutOf(sec *int) (time.Duration, error) {
	if sec == nil {
		return defaultTimeout, nil
	}
	d := time.Duration(*sec) * time.Second
	if *sec < 0 || d > maxTimeout {
		return 0, fmt.Errorf("timeout must be between 0 and %d seconds, got %d", int(maxTimeout/time.Second), *sec)
	}
	return d, nil
}

// optionalBody decodes a request body that may be absent into body and
// checks the timeout it holds; on a bad one it answers 400 and says false.
func optionalBody(w http.ResponseWriter, r *http.Request, body any, timeoutSec **int) (time.Duration, bool) {
	if r.ContentLength != 0 {
		if err := decodeBody(r, body); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return 0, false
		}
	}
	timeout, err := timeoutOf(*timeoutSec)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return 0, false
	}
	return timeout, true
}

// userHome is where E2B's sandboxes keep the user's files (its user
// "user", whose home and default working directory it is): a sandbox made
// here has its workspace there, so code written for E2B finds its paths —
// unless its metadata's mountPathKey names another place (boxrt's own e2b
// backend asks for its session's mount path, /workspace by default).
const (
	userHome     = "/home/user"
	mountPathKey = "boxrt_mount_path"
)

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var body newSandbox
	if err := decodeBody(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	timeout, err := timeoutOf(body.Timeout)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required (\"base\" is boxrt's default image)")
		return
	}
	ctx := r.Context()
	spec := runtime.DefaultSpec()
	spec.SessionID = newSandboxID()
	spec.MountPath = userHome
	if mp := body.Metadata[mountPathKey]; mp != "" {
		spec.MountPath = mp
	}
	if image, ok := h.templateImage(body.TemplateID); ok {
		spec.Image = image
	} else if _, err := h.rt.Snapshots().Get(ctx, body.TemplateID); err == nil {
		spec.FromSnapshot = body.TemplateID
	} else {
		writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found: boxrt knows \"base\", the names under e2b.templates in its configuration and its snapshots' ids", body.TemplateID))
		return
	}
	if mode, set, err := policyOf(body.Network, body.AllowInternetAccess); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	} else if set {
		spec.Network = mode
	}
	if err := spec.Normalize(); err != nil {
		writeRuntimeError(w, err)
		return
	}
	// envVars go into every command's spec: refused here, not at the first
	// command.
	probe := runtime.DefaultSpec()
	probe.SessionID, probe.Env = spec.SessionID, body.EnvVars
	if err := probe.Normalize(); err != nil {
		writeError(w, http.StatusBadRequest, "envVars: "+err.Error())
		return
	}
	h.prune()
	created, err := h.rt.CreateSession(ctx, spec)
	if err != nil {
		writeRuntimeError(w, err)
		return
	}
	sb, err := h.adopt(ctx, spec.SessionID, created.SessionInfo, sandboxInit{template: body.TemplateID, envs: body.EnvVars,
		metadata: body.Metadata, autoPause: body.AutoPause, timeout: timeout})
	if err != nil {
		writeRuntimeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, sb.json())
}

// sandboxInit is what a new record starts with; an adopted session has
// template base and nothing else (no timeout).
type sandboxInit struct {
	template       string
	envs, metadata map[string]string
	autoPause      bool
	timeout        time.Duration
}

var adopted = sandboxInit{template: "base"}

// adopt returns the E2B record of a session, making one (with a fresh
// access token) for a session created elsewhere (JSON-RPC, LangBot).
func (h *Handler) adopt(ctx context.Context, id string, info runtime.SessionInfo, first sandboxInit) (*sandbox, error) {
	physical, err := tenant.Resolve(ctx, "sandboxID", id)
	if err != nil {
		return nil, err
	}
	if sb := h.sandboxes.get(physical); sb != nil {
		return sb, nil
	}
	p, scoped := tenant.FromContext(ctx)
	now := time.Now()
	sb := &sandbox{physical: physical, logical: id, placement: p, scoped: scoped, token: randomHex(24),
		template: first.template, envs: first.envs, metadata: first.metadata, autoPause: first.autoPause, started: now,
		box: info.Sandbox, procs: map[uint32]*command{}}
	if first.timeout > 0 {
		sb.endAt = now.Add(first.timeout)
	}
	// One record write (put), with the timeout already in it.
	kept := h.sandboxes.put(sb)
	if kept == sb && first.timeout > 0 {
		h.sandboxes.arm(sb, sb.endAt, first.timeout, func() { h.expire(sb) })
	}
	return kept, nil
}

func (sb *sandbox) json() sandboxJSON {
	return sandboxJSON{TemplateID: sb.template, SandboxID: sb.logical, ClientID: "boxrt", EnvdVersion: envdVersion,
		EnvdAccessToken: sb.token}
}

// prune forgets the records of sessions that ended another way, so the
// records stay as many as the sessions.
func (h *Handler) prune() {
	live := map[string]bool{}
	for _, s := range h.rt.Internal().Sessions() {
		live[s.SessionID] = true
	}
	h.sandboxes.retain(live)
}

// context is ctx in the placement sb was made in.
func (sb *sandbox) context(ctx context.Context) context.Context {
	if sb.scoped {
		return tenant.WithPlacement(ctx, sb.placement)
	}
	return ctx
}

// expire kills (or with autoPause, pauses) the sandbox at its timeout,
// in the placement it was made.
func (h *Handler) expire(sb *sandbox) {
	ctx := sb.context(context.Background())
	if sb.autoPause {
		h.sandboxes.stopTimer(sb)
		if _, err := h.rt.SuspendSession(ctx, sb.logical); err != nil {
			h.opts.Log.Warn().Err(err).Str("sandbox_id", sb.logical).Msg("e2b: the sandbox's timeout could not pause it")
		}
		return
	}
	if err := h.rt.DeleteSession(ctx, sb.logical); err != nil && !errors.Is(err, boxerr.ErrSessionNotFound) {
		h.opts.Log.Warn().Err(err).Str("sandbox_id", sb.logical).Msg("e2b: the sandbox's timeout could not kill it")
	}
	h.sandboxes.remove(sb.physical)
}

// detail describes a session for get and list.
func (h *Handler) detail(ctx context.Context, info runtime.SessionInfo, withToken bool) detailJSON {
	logical := tenant.Logical(ctx, info.SessionID)
	d := detailJSON{TemplateID: "base", SandboxID: logical, ClientID: "boxrt", StartedAt: info.CreatedAt.UTC(),
		EnvdVersion: envdVersion, CPUCount: max(1, int(info.CPUs)), MemoryMB: info.MemoryMB,
		DiskSizeMB: info.WorkspaceQuotaMB, Metadata: map[string]string{}, State: "running"}
	if info.State == backends.StateSuspended {
		d.State = "paused"
	}
	if sb := h.sandboxes.get(info.SessionID); sb != nil {
		d.TemplateID, d.EndAt = sb.template, sb.deadline().UTC()
		if sb.metadata != nil {
			d.Metadata = sb.metadata
		}
		if withToken {
			d.EnvdAccessToken = sb.token
		}
	}
	return d
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	states := map[string]bool{}
	for _, s := range strings.Split(q.Get("state"), ",") {
		if s != "" {
			states[s] = true
		}
	}
	want, err := url.ParseQuery(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "metadata must be a URL-encoded query such as user=abc&app=prod: "+err.Error())
		return
	}
	// The deprecated /sandboxes lists running sandboxes only.
	if len(states) == 0 && r.URL.Path == Prefix+"/sandboxes" {
		states["running"] = true
	}
	out := []detailJSON{}
	for _, info := range h.rt.ListSessions(ctx) {
		d := h.detail(ctx, info, false)
		if (len(states) > 0 && !states[d.State]) || !metadataMatches(d.Metadata, want) {
			continue
		}
		out = append(out, d)
	}
	writeJSON(w, http.StatusOK, out)
}

func metadataMatches(have map[string]string, want url.Values) bool {
	for k := range want {
		if have[k] != want.Get(k) {
			return false
		}
	}
	return true
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	h.withSandbox(w, r, func(_ *sandbox, info runtime.SessionInfo) {
		writeJSON(w, http.StatusOK, h.detail(r.Context(), info, true))
	})
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	id := r.PathValue("id")
	if err := h.rt.DeleteSession(ctx, id); err != nil {
		writeRuntimeError(w, err)
		return
	}
	if physical, err := tenant.Resolve(ctx, "sandboxID", id); err == nil {
		h.sandboxes.remove(physical)
	}
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is SandboxTimeoutRequest and ConnectSandbox.
type timeoutBody struct {
	Timeout *int `json:"timeout"`
}

// withSandbox runs fn on the record of the session the path names.
func (h *Handler) withSandbox(w http.ResponseWriter, r *http.Request, fn func(*sandbox, runtime.SessionInfo)) {
	ctx := r.Context()
	id := r.PathValue("id")
	details, err := h.rt.GetSession(ctx, id)
	if err != nil {
		writeRuntimeError(w, err)
		return
	}
	sb, err := h.adopt(ctx, id, details.SessionInfo, adopted)
	if err != nil {
		writeRuntimeError(w, err)
		return
	}
	fn(sb, details.SessionInfo)
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decodeBody(r, &body); err != nil || body.Timeout == nil {
		writeError(w, http.StatusBadRequest, "the body must be {\"timeout\": seconds}")
		return
	}
	timeout, err := timeoutOf(body.Timeout)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.withSandbox(w, r, func(sb *sandbox, _ runtime.SessionInfo) {
		h.sandboxes.setTimeout(sb, timeout, time.Now(), func() { h.expire(sb) })
		w.WriteHeader(http.StatusNoContent)
	})
}

// refresh extends the timeout by the body's duration (default 60 s),
// never shortening it.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) {
	sec := 60
	body := struct {
		Duration *int `json:"duration"`
	}{}
	if r.ContentLength != 0 {
		if err := decodeBody(r, &body); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	if body.Duration != nil {
		sec = *body.Duration
	}
	timeout, err := timeoutOf(&sec)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.withSandbox(w, r, func(sb *sandbox, _ runtime.SessionInfo) {
		h.extend(sb, timeout)
		w.WriteHeader(http.StatusNoContent)
	})
}

// extend sets sb's end to d from now unless it ends later already.
func (h *Handler) extend(sb *sandbox, d time.Duration) {
	now := time.Now()
	if now.Add(d).After(sb.deadline()) {
		h.sandboxes.setTimeout(sb, d, now, func() { h.expire(sb) })
	}
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request) {
	h.withSandbox(w, r, func(sb *sandbox, info runtime.SessionInfo) {
		if info.State == backends.StateSuspended {
			writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already paused", sb.logical))
			return
		}
		if _, err := h.rt.SuspendSession(r.Context(), sb.logical); err != nil {
			writeRuntimeError(w, err)
			return
		}
		h.sandboxes.stopTimer(sb)
		w.WriteHeader(http.StatusNoContent)
	})
}

// resume is the deprecated resume: a running sandbox is a conflict.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request) {
	h.resumeOrConnect(w, r, false)
}

// connect resumes a paused sandbox (201) or answers a running one (200);
// the timeout, when given, is only ever extended.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request) {
	h.resumeOrConnect(w, r, true)
}

func (h *Handler) resumeOrConnect(w http.ResponseWriter, r *http.Request, running bool) {
	var body timeoutBody
	timeout, ok := optionalBody(w, r, &body, &body.Timeout)
	if !ok {
		return
	}
	h.withSandbox(w, r, func(sb *sandbox, info runtime.SessionInfo) {
		status := http.StatusCreated
		switch {
		case info.State != backends.StateSuspended && !running:
			writeError(w, http.StatusConflict, fmt.Sprintf("sandbox %s is already running", sb.logical))
			return
		case info.State != backends.StateSuspended:
			status = http.StatusOK
		default:
			if _, err := h.rt.ResumeSession(r.Context(), sb.logical); err != nil {
				writeRuntimeError(w, err)
				return
			}
		}
		// Without a timeout the sandbox keeps what it has (a session made
		// by JSON-RPC: none).
		if body.Timeout != nil {
			h.extend(sb, timeout)
		}
		writeJSON(w, status, sb.json())
	})
}
