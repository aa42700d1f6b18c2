package e2bapi

import (
	"context"
	"crypto/subtle"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/boxrt/boxrt/actions"
	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// Prefix is where the control API is mounted; envd is under EnvdPrefix.
const (
	Prefix     = "/e2b"
	EnvdPrefix = Prefix + "/envd"
)

// envdVersion is the envd version boxrt claims: the SDKs enable features
// by it (closeStdin from 0.5.2, stdin: false from 0.3.0, no default user
// from 0.4.0), and boxrt serves what those versions have.
const envdVersion = "0.5.7"

// defaultTimeout is E2B's sandbox timeout when create names none.
const defaultTimeout = 15 * time.Second

// maxTimeout bounds a sandbox's timeout (E2B's longest plan: 24 h).
const maxTimeout = 24 * time.Hour

// Options configure the handler.
type Options struct {
	// Token is the control token: E2B's API key.
	Token string
	// Scope is the placement a request runs in (as the relay's), or none.
	Scope func(*http.Request) (tenant.Placement, bool)
	// Watches is the budget directory watches share (box_fs_watch's).
	Watches *actions.WatchBudget
	Log     zerolog.Logger
}

// Handler serves E2B's API; Close stops its timers.
type Handler struct {
	rt        *runtime.Runtime
	opts      Options
	sandboxes *registry
}

// New returns the handler of E2B's API over rt.
func New(rt *runtime.Runtime, opts Options) *Handler {
	return &Handler{rt: rt, opts: opts, sandboxes: newRegistry()}
}

// Close stops the sandboxes' timeouts; the sessions stay the runtime's.
func (h *Handler) Close() { h.sandboxes.close() }

// Mount registers the control API and envd on mux.
func (h *Handler) Mount(mux *http.ServeMux) {
	h.mountControl(mux)
	mux.Handle(EnvdPrefix+"/", http.StripPrefix(EnvdPrefix, h.envd()))
}

// scoped is r's context with the placement its scope names.
func (h *Handler) scoped(r *http.Request) context.Context {
	ctx := r.Context()
	if h.opts.Scope != nil {
		if p, ok := h.opts.Scope(r); ok {
			ctx = tenant.WithPlacement(ctx, p)
		}
	}
	return ctx
}

// control wraps a control route: the API key, then the scope.
func (h *Handler) control(fn func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" || subtle.ConstantTimeCompare([]byte(key), []byte(h.opts.Token)) != 1 {
			writeError(w, http.StatusUnauthorized, "Invalid API key: send boxrt's control token as X-API-Key (E2B_API_KEY)")
			return
		}
		fn(w, r.WithContext(h.scoped(r)))
	})
}
