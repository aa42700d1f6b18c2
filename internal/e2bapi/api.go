package e2bapi

import (
	"context"
	"crypto/subtle"
	"net/http"
	"path/filepath"
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
	// StateDir keeps the sandboxes' records (records.go); "" keeps them
	// in memory only.
	StateDir string
}

// Handler serves E2B's API; Close stops its timers.
type Handler struct {
	rt        *runtime.Runtime
	opts      Options
	sandboxes *registry
}

// New returns the handler of E2B's API over rt.
func New(rt *runtime.Runtime, opts Options) *Handler {
	store := recordStore{}
	if opts.StateDir != "" {
		store.dir = filepath.Join(opts.StateDir, recordsDir)
	}
	h := &Handler{rt: rt, opts: opts}
	h.sandboxes = newRegistry(store, func(err error) { opts.Log.Warn().Err(err).Msg("e2b records") })
	h.sandboxes.restore(func(sb *sandbox) func() { return func() { h.expire(sb) } })
	return h
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

// TenantInstance is the instance of the placements E2B API keys name: a
// key's Workspace is its own, apart from LangBot's Workspaces.
const TenantInstance = "e2b"

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// keyScope is the context a control request with API key runs in: the
// control token's is the request's scope; a key of the configuration's
// e2b.api_keys (key → Workspace) runs in that Workspace, whose sandboxes
// no other key sees.
func (h *Handler) keyScope(r *http.Request, key string) (context.Context, bool) {
	if key == "" {
		return nil, false
	}
	if equal(key, h.opts.Token) {
		return h.scoped(r), true
	}
	keys, _ := h.rt.Config().E2B["api_keys"].(map[string]any)
	for k, v := range keys {
		if ws, _ := v.(string); ws != "" && k != "" && equal(key, k) {
			return tenant.WithPlacement(r.Context(), tenant.Placement{Instance: TenantInstance, Workspace: ws, Generation: 1}), true
		}
	}
	return nil, false
}

// control wraps a control route: the API key, then its scope.
func (h *Handler) control(fn func(http.ResponseWriter, *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, ok := h.keyScope(r, r.Header.Get("X-API-Key"))
		if !ok {
			writeError(w, http.StatusUnauthorized, "Invalid API key: send boxrt's control token or a key of e2b.api_keys as X-API-Key (E2B_API_KEY)")
			return
		}
		fn(w, r.WithContext(ctx))
	})
}
