package tenant

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
)

// Placement is one Workspace at one placement generation, as a tenant
// context names it. Its sessions live under physical ids
// "<namespace>-g<generation>-<sanitised logical id>", so tenants sharing
// one runtime never see each other's sessions, and a new generation never
// reuses an old one's.
type Placement struct {
	Instance   string
	Workspace  string
	Generation int64
}

// WorkspaceNamespace is "ws-" + the first 24 hex digits of
// SHA-256(instance "\x00" workspace), independent of the generation.
func WorkspaceNamespace(instance, workspace string) string {
	sum := sha256.Sum256([]byte(instance + "\x00" + workspace))
	return "ws-" + hex.EncodeToString(sum[:])[:24]
}

// Namespace is the Workspace namespace of p.
func (p Placement) Namespace() string { return WorkspaceNamespace(p.Instance, p.Workspace) }

// Prefix is what every physical id of p starts with.
func (p Placement) Prefix() string {
	return p.Namespace() + "-g" + strconv.FormatInt(p.Generation, 10) + "-"
}

var unsafeIDRun = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// PhysicalID maps a logical session id to the id the runtime stores, as
// the reference does: trimmed, each run of characters outside
// [A-Za-z0-9_.-] replaced by one '-', '-' trimmed at both ends. Two
// logical ids may map to one physical id ("a b", "a-b"), as there.
func (p Placement) PhysicalID(logical string) (string, error) {
	id := strings.TrimSpace(logical)
	if id == "" {
		return "", boxerr.Validation("session_id", "Box session_id must not be empty")
	}
	id = strings.Trim(unsafeIDRun.ReplaceAllString(id, "-"), "-")
	if id == "" {
		return "", boxerr.Validation("session_id", "Box session_id must contain a valid character")
	}
	return p.Prefix() + id, nil
}

// Owns reports whether a physical id belongs to p (its generation).
func (p Placement) Owns(physical string) bool {
	prefix := p.Prefix()
	return len(physical) > len(prefix) && strings.HasPrefix(physical, prefix)
}

// InWorkspace reports whether a physical id belongs to p's Workspace, at
// any generation.
func (p Placement) InWorkspace(physical string) bool {
	return strings.HasPrefix(physical, p.Namespace()+"-g")
}

// LogicalID strips p's prefix; other ids are returned unchanged.
func (p Placement) LogicalID(physical string) string {
	if p.Owns(physical) {
		return physical[len(p.Prefix()):]
	}
	return physical
}

// physicalShape is the shape of every Workspace's physical ids.
var physicalShape = regexp.MustCompile(`^ws-[0-9a-f]{24}-g[0-9]+-`)

// IsPhysical reports whether id has the shape of a Workspace's physical
// id, which only that Workspace may name (by its logical id).
func IsPhysical(id string) bool { return physicalShape.MatchString(strings.TrimSpace(id)) }

type placementKey struct{}

// WithPlacement returns ctx running in p's namespace.
func WithPlacement(ctx context.Context, p Placement) context.Context {
	return context.WithValue(ctx, placementKey{}, p)
}

// FromContext returns the placement ctx runs in; false is the default
// namespace.
func FromContext(ctx context.Context) (Placement, bool) {
	p, ok := ctx.Value(placementKey{}).(Placement)
	return p, ok
}

// Resolve maps the session id a caller names to the physical id the
// runtime keys it by, within ctx's namespace. The default namespace keeps
// ids as they are but refuses a Workspace's physical id: whether it exists
// or not, the answer is the same.
func Resolve(ctx context.Context, field, id string) (string, error) {
	if p, ok := FromContext(ctx); ok {
		physical, err := p.PhysicalID(id)
		if err != nil {
			return "", boxerr.Validation(field, "%s", err.Error())
		}
		return physical, nil
	}
	if IsPhysical(id) {
		return "", boxerr.Validation(field, "%s %q is a Workspace's session id: only that Workspace names it, by its logical id (send the Workspace's context)", field, id)
	}
	return id, nil
}

// Visible reports whether a session's physical id is in ctx's namespace:
// the placement's own generation, or, without one, any id that is no
// Workspace's.
func Visible(ctx context.Context, physical string) bool {
	if p, ok := FromContext(ctx); ok {
		return p.Owns(physical)
	}
	return !IsPhysical(physical)
}

// VisibleWorkspace is Visible for what a Workspace keeps across its
// generations (snapshots): any generation of the placement's Workspace.
func VisibleWorkspace(ctx context.Context, physical string) bool {
	if p, ok := FromContext(ctx); ok {
		return p.InWorkspace(physical)
	}
	return !IsPhysical(physical)
}

// Scope names ctx's namespace ("" for the default one), for stores that
// key owned things by it.
func Scope(ctx context.Context) string {
	if p, ok := FromContext(ctx); ok {
		return p.Prefix()
	}
	return ""
}

// Logical is the id the caller of ctx knows a physical id by.
func Logical(ctx context.Context, physical string) string {
	if p, ok := FromContext(ctx); ok {
		return p.LogicalID(physical)
	}
	return physical
}
