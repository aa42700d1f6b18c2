package actions

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"

	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime/boxerr"
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

// PlacementOf returns the placement a tenant context names; a context
// without a generation is at generation 1, as the reference defaults it.
func PlacementOf(m *rpc.Meta) Placement {
	gen := max(m.PlacementGeneration, 1)
	return Placement{Instance: strings.TrimSpace(m.InstanceUUID), Workspace: strings.TrimSpace(m.WorkspaceUUID), Generation: gen}
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

// Owns reports whether a physical id belongs to p.
func (p Placement) Owns(physical string) bool {
	prefix := p.Prefix()
	return len(physical) > len(prefix) && strings.HasPrefix(physical, prefix)
}

// LogicalID strips p's prefix; other ids are returned unchanged.
func (p Placement) LogicalID(physical string) string {
	if p.Owns(physical) {
		return physical[len(p.Prefix()):]
	}
	return physical
}

// rewriteSessionID replaces the top-level session_id of params with its
// physical id. Params without one are left for the method to refuse.
func (p Placement) rewriteSessionID(params json.RawMessage) (json.RawMessage, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(params, &members); err != nil || members == nil {
		return params, nil // the method's strict decoder words the error
	}
	raw, ok := members["session_id"]
	if !ok {
		return params, nil
	}
	var logical string
	if err := json.Unmarshal(raw, &logical); err != nil {
		return params, nil
	}
	physical, err := p.PhysicalID(logical)
	if err != nil {
		return nil, err
	}
	members["session_id"], _ = json.Marshal(physical)
	return json.Marshal(members)
}

// logicalResult rewrites every "session_id" member, at any depth, that
// names one of p's physical ids back to its logical id.
func (p Placement) logicalResult(res json.RawMessage) (json.RawMessage, error) {
	if !bytes.Contains(res, []byte(p.Prefix())) {
		return res, nil
	}
	dec := json.NewDecoder(bytes.NewReader(res))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, boxerr.Failure("cannot map session ids back: %v", err).Wrap(err)
	}
	v = p.mapIDs(v)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, boxerr.Failure("cannot map session ids back: %v", err).Wrap(err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func (p Placement) mapIDs(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, val := range t {
			if s, ok := val.(string); ok && k == "session_id" {
				t[k] = p.LogicalID(s)
				continue
			}
			t[k] = p.mapIDs(val)
		}
	case []any:
		for i := range t {
			t[i] = p.mapIDs(t[i])
		}
	}
	return v
}
