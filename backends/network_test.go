package backends

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/internal/egress"
)

// TestNetworkMode: a mode is "off", "on" or a policy object on the wire
// and in saved state, canonical inside, and a bad rule is a validation
// error naming it.
func TestNetworkMode(t *testing.T) {
	for _, tc := range []struct{ in, canon, wire string }{
		{`"off"`, "off", `"off"`},
		{`"on"`, "on", `"on"`},
		{`{"allow": ["PyPI.org:443", "*.github.com"], "deny": []}`, `{"allow":["pypi.org:443","*.github.com"]}`, `{"allow":["pypi.org:443","*.github.com"]}`},
		{`{"allow":[]}`, `{"allow":[]}`, `{"allow":[]}`},
		{`{"allow":["10.0.0.0/8"],"deny":["10.1.2.3:22"]}`, `{"allow":["10.0.0.0/8"],"deny":["10.1.2.3:22"]}`, `{"allow":["10.0.0.0/8"],"deny":["10.1.2.3:22"]}`},
	} {
		var m NetworkMode
		if err := json.Unmarshal([]byte(tc.in), &m); err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		canon, err := CanonicalNetwork(m, "network")
		if err != nil || string(canon) != tc.canon {
			t.Errorf("%s: canonical %q (%v), want %q", tc.in, canon, err, tc.canon)
		}
		out, _ := json.Marshal(struct {
			N NetworkMode `json:"network"`
		}{canon})
		if want := `{"network":` + tc.wire + `}`; string(out) != want {
			t.Errorf("%s: marshalled %s, want %s", tc.in, out, want)
		}
		if !canon.Egress() && tc.canon != "off" {
			t.Errorf("%s: no egress", tc.in)
		}
	}
	for _, tc := range []struct{ in, field string }{
		{`"maybe"`, "network"},
		{`{"allow":["ok.example","bad host"]}`, "network.allow[1]"},
		{`{"deny":["10.0.0.1/8"]}`, "network.deny[0]"},
		{`{"allow":[],"block":[]}`, "network"},
	} {
		var m NetworkMode
		err := json.Unmarshal([]byte(tc.in), &m)
		if err == nil {
			_, err = CanonicalNetwork(m, "network")
		}
		var be *boxerr.Error
		if !errors.As(err, &be) || !errors.Is(err, boxerr.ErrValidation) || !strings.HasPrefix(be.Msg, tc.field) {
			t.Errorf("%s: %v, want a validation error on %s", tc.in, err, tc.field)
		}
	}
	var m NetworkMode
	if err := json.Unmarshal([]byte(`[1]`), &m); !errors.Is(err, boxerr.ErrValidation) {
		t.Errorf("a list: %v", err)
	}
}

// TestRefuseEgressPolicy: a backend without the proxy takes "off" and
// "on" only, and no secrets.
func TestRefuseEgressPolicy(t *testing.T) {
	spec := DefaultSandboxSpec()
	for _, n := range []NetworkMode{NetworkOff, NetworkOn} {
		spec.Network = n
		if err := spec.RefuseEgressPolicy("kube"); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	spec.Network = `{"allow":[]}`
	if err := spec.RefuseEgressPolicy("kube"); !errors.Is(err, boxerr.ErrValidation) {
		t.Errorf("a policy: %v", err)
	}
	spec.Network = NetworkOn
	spec.Secrets = make([]egress.Secret, 1)
	if err := spec.RefuseEgressPolicy("kube"); !errors.Is(err, boxerr.ErrValidation) {
		t.Errorf("secrets: %v", err)
	}
}
