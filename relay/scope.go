package relay

import (
	"context"
	"net/http"

	"github.com/boxrt/boxrt/runtime/tenant"
)

// Scope reads the Workspace placement a request's headers name (the
// LangBot relay headers, checked against the trusted instance); false
// means none: the request runs in the default namespace, which cannot
// name a Workspace's session.
type Scope func(r *http.Request) (tenant.Placement, bool)

// scoped returns the context and session id the runtime is asked with for
// a request whose path names the physical session id: within the placement
// the headers name, whose session it must be (ok false otherwise), or in
// the default namespace.
func scoped(scope Scope, r *http.Request, physical string) (ctx context.Context, sessionID string, ok bool) {
	if scope == nil {
		return r.Context(), physical, true
	}
	p, named := scope(r)
	if !named {
		return r.Context(), physical, true
	}
	if !p.Owns(physical) {
		return nil, "", false
	}
	return tenant.WithPlacement(r.Context(), p), p.LogicalID(physical), true
}
