package rpc

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
)

// BearerSubprotocolPrefix lets clients that cannot set headers (browsers,
// some MCP SDK transports) offer the token as a WebSocket subprotocol
// "boxrt.bearer.<base64url(token)>".
const BearerSubprotocolPrefix = "boxrt.bearer."

// AcceptedSubprotocols returns the subprotocols the server may select for r:
// "mcp" when offered. The bearer subprotocol is never selected, so the token
// is not echoed back.
func AcceptedSubprotocols(r *http.Request) []string {
	for _, p := range offeredSubprotocols(r) {
		if p == "mcp" {
			return []string{"mcp"}
		}
	}
	return nil
}

func offeredSubprotocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// Authenticator checks the control token on HTTP requests.
type Authenticator struct {
	token []byte
}

// NewAuthenticator returns an Authenticator; an empty token allows every
// request (only permitted on loopback listeners).
func NewAuthenticator(token string) *Authenticator {
	return &Authenticator{token: []byte(token)}
}

// Enabled reports whether a token is required.
func (a *Authenticator) Enabled() bool { return len(a.token) > 0 }

// Check reports whether r carries the token, in an Authorization bearer
// header or the bearer subprotocol. Tokens in URLs are never accepted.
func (a *Authenticator) Check(r *http.Request) bool {
	if !a.Enabled() {
		return true
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && a.equal([]byte(strings.TrimSpace(v))) {
		return true
	}
	for _, p := range offeredSubprotocols(r) {
		if enc, ok := strings.CutPrefix(p, BearerSubprotocolPrefix); ok {
			if tok, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(enc, "=")); err == nil && a.equal(tok) {
				return true
			}
		}
	}
	return false
}

func (a *Authenticator) equal(got []byte) bool {
	return subtle.ConstantTimeCompare(got, a.token) == 1
}

// Require wraps h so that unauthenticated requests get 401 with a JSON body.
func (a *Authenticator) Require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Check(r) {
			msg := "missing or wrong control token: send it as 'Authorization: Bearer <token>'"
			if r.URL.RawQuery != "" && strings.Contains(strings.ToLower(r.URL.RawQuery), "token") {
				msg = "tokens in URLs are refused: send 'Authorization: Bearer <token>' instead"
			}
			WriteHTTPError(w, http.StatusUnauthorized, "Unauthorized", msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// WriteHTTPError writes {"error":{"type","message"}} with status.
func WriteHTTPError(w http.ResponseWriter, status int, typ, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": typ, "message": message}})
}
