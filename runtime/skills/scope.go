package skills

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// TenantsDir is the directory under the store root that holds the
// Workspace-scoped stores (reference §8.4, §9.1).
const TenantsDir = "tenants"

// ValidateNamespace applies the reference's rule for a Workspace namespace
// naming a scoped root: non-empty, no '/' or '\', not "." or "..".
func ValidateNamespace(namespace string) error {
	if namespace == "" || namespace == "." || namespace == ".." || strings.ContainsAny(namespace, `/\`) {
		return boxerr.Validation("namespace", "Invalid Workspace skill namespace: %q", namespace)
	}
	return nil
}

// ScopedRoot is the root of namespace's store under root:
// <root>/tenants/<namespace>; "" when root is not configured.
func ScopedRoot(root, namespace string) string {
	if strings.TrimSpace(root) == "" {
		return ""
	}
	return filepath.Join(root, TenantsDir, namespace)
}

// Scoped returns the Workspace-scoped view of s rooted at
// <root>/tenants/<namespace> (created 0755 on first use, as the root is):
// a tenant sees and changes only its own skills, and can adopt, scan or
// mount nothing outside that directory. Views are cached, follow s's live
// root (box_init may move it) and share s's limits, uploads and private
// work directory; Close s, not a view.
func (s *Store) Scoped(namespace string) (*Store, error) {
	if s.scopes == nil {
		return nil, boxerr.Failure("a Workspace-scoped skill store cannot be scoped again")
	}
	if err := ValidateNamespace(namespace); err != nil {
		return nil, err
	}
	s.scopeMu.Lock()
	defer s.scopeMu.Unlock()
	if v, ok := s.scopes[namespace]; ok {
		return v, nil
	}
	v := &Store{rootFn: func() string { return ScopedRoot(s.rootFn(), namespace) }, work: s.work}
	// Staging left by a boxrt killed mid-install, as New clears the root's.
	if root := v.rootFn(); root != "" {
		removeLeftovers(root, stagingPrefix)
	}
	s.scopes[namespace] = v
	return v, nil
}

// scopesDir is the directory under root (a real path) holding s's scoped
// views, which s's own listings leave out, so a single-tenant request sees
// no Workspace's skills; "" for a view, which has none.
func (s *Store) scopesDir(root string) string {
	if s.scopes == nil {
		return ""
	}
	return filepath.Join(root, TenantsDir)
}

type storeKey struct{}

// NewContext returns ctx carrying st, the store a request's skill
// operations and skill mounts use (a Workspace-scoped view for a tenant's
// request).
func NewContext(ctx context.Context, st *Store) context.Context {
	return context.WithValue(ctx, storeKey{}, st)
}

// FromContext returns the store NewContext put in ctx, or fallback.
func FromContext(ctx context.Context, fallback *Store) *Store {
	if st, ok := ctx.Value(storeKey{}).(*Store); ok && st != nil {
		return st
	}
	return fallback
}

// ContextResolver resolves skill mounts (runtime.SkillResolver) in the
// store of the request's context, falling back to Base.
type ContextResolver struct{ Base *Store }

// PackageRoot implements runtime.SkillResolver.
func (r ContextResolver) PackageRoot(ctx context.Context, name string) (string, error) {
	return FromContext(ctx, r.Base).PackageRoot(ctx, name)
}
