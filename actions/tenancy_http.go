package actions

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/boxrt/boxrt/internal/boxerr"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// The LangBot host's HTTP headers: on /rpc/ws the token and instance, on
// the relay also the Workspace and placement generation of the process.
const (
	HeaderControlToken        = "X-LangBot-Box-Control-Token"
	HeaderInstanceID          = "X-LangBot-Instance-Id"
	HeaderWorkspaceID         = "X-LangBot-Workspace-Id"
	HeaderPlacementGeneration = "X-LangBot-Placement-Generation"
)

// maxWorkspaceHeader bounds the Workspace header, as the reference does.
const maxWorkspaceHeader = 256

// LangBotTokenOK reports whether r carries the control token in the
// LangBot header. An empty token (none configured) admits every request,
// as in the reference; boxrt only allows that on a loopback listener.
func LangBotTokenOK(r *http.Request, token string) bool {
	if token == "" {
		return true
	}
	got := strings.TrimSpace(r.Header.Get(HeaderControlToken))
	return subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// RequireLangBotControl guards /rpc/ws the way the reference does, before
// the upgrade: the token (when configured) and an instance id header of
// the trusted instance, the first connection pinning it when none is
// configured. Failure is 401 "Unauthorized" (text/plain). A client that
// sends boxrt's own bearer token instead is passed to fallback.
func RequireLangBotControl(h http.Handler, token string, trust *Trust, fallback func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		instance := strings.TrimSpace(r.Header.Get(HeaderInstanceID))
		tokenOK := LangBotTokenOK(r, token) || (fallback != nil && fallback(r))
		if !tokenOK || !InstanceIDPattern.MatchString(instance) || !trust.Pin(instance) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte("Unauthorized"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// RelayAuthorizer admits a relay request carrying the LangBot headers: the
// token (when configured), the trusted instance, a Workspace and a
// canonical positive generation that the fence currently holds, and a
// session id (physical) of that placement. In admission mode the relay is
// refused, as the reference refuses it (its policy permits no managed
// processes).
func (t *Tenancy) RelayAuthorizer(token string) func(r *http.Request, sessionID, processID string) bool {
	return func(r *http.Request, sessionID, _ string) bool {
		if r.Header.Get(HeaderInstanceID) == "" || !LangBotTokenOK(r, token) {
			return false
		}
		p, ok := relayPlacement(r)
		if !ok || !t.trust.Matches(p.Instance) || !t.fence.Holds(p) || t.grants.required() {
			return false
		}
		return p.Owns(sessionID)
	}
}

// RequestPlacement is the placement an HTTP request (relay, files
// endpoint) runs in: the one its LangBot headers name, when they are well
// formed and name the trusted instance (which they never pin). A request
// without them (or with malformed ones) runs in the default namespace,
// which names no Workspace's session.
func (t *Tenancy) RequestPlacement(r *http.Request) (tenant.Placement, bool) {
	p, ok := relayPlacement(r)
	if !ok || !t.trust.pinned(p.Instance) {
		return tenant.Placement{}, false
	}
	return p, true
}

// relayPlacement reads the placement from the relay headers.
func relayPlacement(r *http.Request) (tenant.Placement, bool) {
	instance := strings.TrimSpace(r.Header.Get(HeaderInstanceID))
	workspace := strings.TrimSpace(r.Header.Get(HeaderWorkspaceID))
	genText := strings.TrimSpace(r.Header.Get(HeaderPlacementGeneration))
	gen, err := strconv.ParseInt(genText, 10, 64)
	if !InstanceIDPattern.MatchString(instance) || workspace == "" || len(workspace) > maxWorkspaceHeader ||
		err != nil || gen < 1 || strconv.FormatInt(gen, 10) != genText {
		return tenant.Placement{}, false
	}
	return tenant.Placement{Instance: instance, Workspace: workspace, Generation: gen}, true
}

// ApplyStartupConfig reads what the tenancy layer needs from the start-up
// configuration (LANGBOT_BOX_CONFIG): the backend the host asked for and
// the admission policy.
func (t *Tenancy) ApplyStartupConfig(patch string) {
	raw := json.RawMessage(strings.TrimSpace(patch))
	if len(raw) == 0 {
		return
	}
	if _, requested, err := TranslateLangBotConfig(raw); err == nil && requested != "" {
		t.mu.Lock()
		t.requestedBackend = requested
		t.mu.Unlock()
	}
	t.grants.configure(raw)
}

// AdmitRelay answers, in admission mode, the relay requests that pass the
// header, instance and fence checks with 400 and the reference's JSON
// error, `{"error": {"code": "<ErrorClass>", "message": "<text>"}}`: a
// BoxReadinessError while managed sandbox isolation is not ready, else the
// refusal of a relay no grant permits (the policy allows no managed
// processes). Everything else goes to next, whose authorizer answers 401.
func (t *Tenancy) AdmitRelay(next http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := relayPlacement(r)
		if !t.grants.required() || !ok || !LangBotTokenOK(r, token) || !t.trust.Matches(p.Instance) || !t.fence.Holds(p) {
			next.ServeHTTP(w, r)
			return
		}
		err := t.ready(r.Context())
		if err == nil {
			err = boxerr.Admission("Sandbox admission grant does not permit managed process relay")
		}
		e := EncodeError(err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": e.Type, "message": e.Message}})
	})
}

// AdmissionRequired reports whether grant-enforced mode is on.
func (t *Tenancy) AdmissionRequired() bool { return t.grants.required() }
