package rpc

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
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

// OfferedTokens returns every bearer token r carries: the Authorization
// header's and each bearer subprotocol's. Tokens in URLs are never read.
func OfferedTokens(r *http.Request) [][]byte {
	var out [][]byte
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, []byte(v))
		}
	}
	for _, p := range offeredSubprotocols(r) {
		if enc, ok := strings.CutPrefix(p, BearerSubprotocolPrefix); ok {
			if tok, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(enc, "=")); err == nil && len(tok) > 0 {
				out = append(out, tok)
			}
		}
	}
	return out
}

// TokenMatches compares each offered token with want in constant time. An
// empty want matches nothing, so a missing configuration fails closed.
func TokenMatches(offered [][]byte, want []byte) bool {
	if len(want) == 0 {
		return false
	}
	ok := false
	for _, tok := range offered {
		if subtle.ConstantTimeCompare(tok, want) == 1 {
			ok = true
		}
	}
	return ok
}

// Authenticator checks the control token on HTTP requests.
type Authenticator struct {
	token []byte
}

// NewAuthenticator returns an Authenticator for token. An empty token
// refuses every request: boxrt always has a control token.
func NewAuthenticator(token string) *Authenticator {
	return &Authenticator{token: []byte(token)}
}

// Check reports whether r carries the control token, in an Authorization
// bearer header or the bearer subprotocol.
func (a *Authenticator) Check(r *http.Request) bool {
	return TokenMatches(OfferedTokens(r), a.token)
}

// Require wraps h so that requests without the control token get 401 with
// a JSON body.
func (a *Authenticator) Require(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.Check(r) {
			WriteUnauthorized(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// WriteUnauthorized answers 401, pointing a client that put a token in the
// URL at the header instead.
func WriteUnauthorized(w http.ResponseWriter, r *http.Request) {
	msg := "missing or wrong token: send it as 'Authorization: Bearer <token>'"
	if r.URL.RawQuery != "" && strings.Contains(strings.ToLower(r.URL.RawQuery), "token") {
		msg = "tokens in URLs are refused: send 'Authorization: Bearer <token>' instead"
	}
	WriteHTTPError(w, http.StatusUnauthorized, "Unauthorized", msg)
}

// WriteHTTPError writes {"error":{"type","message"}} with status.
func WriteHTTPError(w http.ResponseWriter, status int, typ, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": typ, "message": message}})
}

// HostGuard refuses requests whose Host header, or Origin header when one
// is sent, names a host boxrt was not told it answers to. A DNS-rebinding
// page reaches a loopback listener under its own name (Host: evil.example);
// a cross-site page keeps its own Origin. Both are refused before any route
// runs, so a browser cannot be turned into a client of the control plane.
type HostGuard struct {
	names    map[string]bool
	loopback bool
}

// NewHostGuard allows the names a client can legitimately use for a
// listener on listenAddr, plus extra (host names or IP literals, matched
// without the port):
//   - a loopback listen address: localhost and every loopback IP;
//   - a wildcard (0.0.0.0, ::, empty host): those, every address of this
//     machine's interfaces and its host name;
//   - any other address: that host as written.
func NewHostGuard(listenAddr string, extra []string) (*HostGuard, error) {
	host, _, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %w", listenAddr, err)
	}
	g := &HostGuard{names: map[string]bool{}}
	ip := net.ParseIP(host)
	switch {
	case host == "localhost" || (ip != nil && ip.IsLoopback()):
		g.loopback = true
	case host == "" || (ip != nil && ip.IsUnspecified()):
		g.loopback = true
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return nil, fmt.Errorf("list interface addresses: %w", err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				g.add(n.IP.String())
			}
		}
		if h, err := os.Hostname(); err == nil {
			g.add(h)
		}
	default:
		g.add(host)
	}
	for _, h := range extra {
		if h = strings.TrimSpace(h); h != "" {
			g.add(h)
		}
	}
	return g, nil
}

func (g *HostGuard) add(host string) { g.names[canonicalHost(host)] = true }

// canonicalHost lower-cases a host name, drops brackets and a trailing dot,
// and writes IP literals in their canonical form.
func canonicalHost(h string) string {
	h = strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".")
	if ip := net.ParseIP(h); ip != nil {
		return ip.String()
	}
	return h
}

func (g *HostGuard) allowed(host string) bool {
	host = canonicalHost(host)
	if host == "" {
		return false
	}
	if g.loopback {
		if host == "localhost" {
			return true
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return true
		}
	}
	return g.names[host]
}

// Check returns why r is refused, or "" when its Host and Origin are
// allowed.
func (g *HostGuard) Check(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if !g.allowed(host) {
		return fmt.Sprintf("Host %q is not a name this boxrt answers to (see --allowed-hosts)", r.Host)
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || !g.allowed(u.Hostname()) {
			return fmt.Sprintf("Origin %q is not allowed (see --allowed-hosts)", origin)
		}
	}
	return ""
}

// Wrap refuses disallowed requests with 403 and a JSON body.
func (g *HostGuard) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := g.Check(r); why != "" {
			WriteHTTPError(w, http.StatusForbidden, "Forbidden", why)
			return
		}
		h.ServeHTTP(w, r)
	})
}
