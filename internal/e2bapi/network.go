package e2bapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/boxrt/boxrt/backends"
	"github.com/boxrt/boxrt/runtime"
)

// allTraffic is E2B's "everything" destination (the SDK's ALL_TRAFFIC).
const allTraffic = "0.0.0.0/0"

// e2bNetwork is what boxrt reads of E2B's SandboxNetworkConfig (create)
// and SandboxNetworkUpdateConfig (PUT /sandboxes/{id}/network).
type e2bNetwork struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// allowPublicTraffic is about the sandbox's URLs: boxrt's port URLs
	// always need their token, so either value is served.
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	Rules              json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	MaskRequestHost    string          `json:"maskRequestHost"`
	// AllowInternetAccess is the update body's; create has it beside
	// network.
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// policyOf maps E2B's egress settings onto a boxrt policy; set is false
// when there are none (the session gets boxrt's default). E2B lets
// everything out unless denyOut closes it, and allowOut reopens
// destinations within what is denied. boxrt's policies are allow-lists, so
// two shapes map exactly: nothing denied → "on"; everything denied
// (denyOut holding 0.0.0.0/0, or allow_internet_access false) →
// {"allow": allowOut}. Denying only part of the internet has no boxrt
// equivalent and is refused rather than approximated.
func policyOf(n *e2bNetwork, allowInternet *bool) (mode backends.NetworkMode, set bool, err error) {
	if n == nil {
		n = &e2bNetwork{}
	}
	if allowInternet == nil {
		allowInternet = n.AllowInternetAccess
	}
	switch {
	case len(n.Rules) > 0 && string(n.Rules) != "null" && string(n.Rules) != "{}":
		return "", false, fmt.Errorf("network.rules (request transforms) are not supported by boxrt's E2B API: give secrets to boxrt's JSON-RPC sessions instead (docs/protocol.md, secrets)")
	case len(n.EgressProxy) > 0 && string(n.EgressProxy) != "null":
		return "", false, fmt.Errorf("network.egressProxy is not supported by boxrt's E2B API: sessions go out through boxrt's own egress proxy")
	case n.MaskRequestHost != "":
		return "", false, fmt.Errorf("network.maskRequestHost is not supported by boxrt's E2B API")
	}
	denyAll := allowInternet != nil && !*allowInternet || slices.Contains(n.DenyOut, allTraffic)
	if !denyAll && len(n.DenyOut) > 0 {
		return "", false, fmt.Errorf("network.denyOut: boxrt maps only %q (deny everything but allowOut); denying part of the internet has no equivalent in boxrt's allow-list policies", allTraffic)
	}
	if !denyAll {
		if allowInternet == nil && n.AllowOut == nil {
			return "", false, nil
		}
		return backends.NetworkOn, true, nil
	}
	allow := n.AllowOut
	if allow == nil {
		allow = []string{}
	}
	raw, err := json.Marshal(map[string][]string{"allow": allow})
	if err != nil {
		return "", false, err
	}
	return backends.NetworkMode(raw), true, nil
}

// updateNetwork replaces a sandbox's egress rules (E2B: "omitting a field
// clears it", so an empty body lets everything out).
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request) {
	var body e2bNetwork
	if err := decodeBody(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	mode, set, err := policyOf(&body, nil)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !set {
		mode = backends.NetworkOn
	}
	h.withSandbox(w, r, func(sb *sandbox, _ runtime.SessionInfo) {
		st, err := h.rt.UpdateNetwork(r.Context(), sb.logical, mode)
		if err != nil {
			writeRuntimeError(w, err)
			return
		}
		h.sandboxes.setNetwork(sb, st.Policy)
		w.WriteHeader(http.StatusNoContent)
	})
}
