package actions

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// PlacementOf returns the placement a tenant context names; a context
// without a generation is at generation 1, as the reference defaults it.
func PlacementOf(m *rpc.Meta) tenant.Placement {
	gen := max(m.PlacementGeneration, 1)
	return tenant.Placement{Instance: strings.TrimSpace(m.InstanceUUID), Workspace: strings.TrimSpace(m.WorkspaceUUID), Generation: gen}
}

// logicalResult rewrites every "session_id" member, at any depth, that
// names one of p's physical ids back to its logical id. The runtime
// resolves the ids a tenant names (runtime/tenant) but answers with the
// ids it stores; this one pass over a result is the only mapping back.
func logicalResult(p tenant.Placement, res json.RawMessage) (json.RawMessage, error) {
	if !bytes.Contains(res, []byte(p.Prefix())) {
		return res, nil
	}
	dec := json.NewDecoder(bytes.NewReader(res))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, boxerr.Failure("cannot map session ids back: %v", err).Wrap(err)
	}
	v = mapIDs(p, v)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, boxerr.Failure("cannot map session ids back: %v", err).Wrap(err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func mapIDs(p tenant.Placement, v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, val := range t {
			if s, ok := val.(string); ok && k == "session_id" {
				t[k] = p.LogicalID(s)
				continue
			}
			t[k] = mapIDs(p, val)
		}
	case []any:
		for i := range t {
			t[i] = mapIDs(p, t[i])
		}
	}
	return v
}
