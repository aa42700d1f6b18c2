package reconnect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// DefaultRPCPath is the control endpoint's path on a boxrt listener.
const DefaultRPCPath = "/rpc/ws"

// normalizeURL turns a runtime_url into the WebSocket URL to dial:
// http→ws, https→wss, no scheme → ws, no path → /rpc/ws. Credentials in
// the URL are refused, since URLs end up in logs and proxies' access logs.
func normalizeURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", errors.New("reconnect: empty runtime URL")
	}
	if !strings.Contains(raw, "://") {
		raw = "ws://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("reconnect: runtime URL: %w", err)
	}
	switch strings.ToLower(u.Scheme) {
	case "ws", "http":
		u.Scheme = "ws"
	case "wss", "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("reconnect: runtime URL scheme %q: use ws, wss, http or https", u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("reconnect: runtime URL %q has no host", raw)
	}
	if u.User != nil {
		return "", errors.New("reconnect: runtime URL must not carry credentials; use WithToken (sent as an Authorization header)")
	}
	for k := range u.Query() {
		if strings.Contains(strings.ToLower(k), "token") {
			return "", errors.New("reconnect: runtime URL must not carry a token; use WithToken (sent as an Authorization header)")
		}
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = DefaultRPCPath
	}
	u.Fragment = ""
	return u.String(), nil
}

// defaultHTTPClient is used for handshakes unless WithHTTPClient is given.
// Keep-alives are off: every handshake is hijacked or fails, so a pool
// would only hold idle connections (and their goroutines) after failures.
func defaultHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		DisableKeepAlives:   true,
	}}
}

// dialLink opens one WebSocket link.
func dialLink(ctx context.Context, wsURL string, hc *http.Client, o *options) (*link, error) {
	h := http.Header{}
	for k, v := range o.header {
		h[k] = append([]string(nil), v...)
	}
	if o.token != "" {
		h.Set("Authorization", "Bearer "+o.token)
	}
	conn, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: h})
	if err != nil {
		if resp != nil {
			body := ""
			if resp.Body != nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
				_ = resp.Body.Close()
				body = strings.TrimSpace(string(b))
			}
			if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
				if o.token == "" {
					return nil, permanent(fmt.Errorf("%s wants a control token (HTTP %d) and none was sent: %s; use WithToken", wsURL, resp.StatusCode, o.noToken))
				}
				return nil, permanent(fmt.Errorf("%s refused the control token (HTTP %d): %s", wsURL, resp.StatusCode, body))
			}
			return nil, fmt.Errorf("WebSocket handshake with %s: HTTP %d: %s", wsURL, resp.StatusCode, body)
		}
		return nil, fmt.Errorf("dialing %s: %w", wsURL, err)
	}
	conn.SetReadLimit(MaxMessageBytes)
	return newLink(&wsConn{c: conn}, nil, wsURL, o.logger), nil
}
