package test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// httpGet sends one GET with the given headers; host overrides the Host
// header (what a DNS-rebinding page sends).
func httpGet(t *testing.T, addr, path, host string, h http.Header) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	require.NoError(t, err)
	for k, v := range h {
		req.Header[k] = v
	}
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	}
	return resp.StatusCode, body
}

// upgradeHeaders make a request look like a WebSocket handshake, so a route
// that accepted it would answer 101 rather than a pre-upgrade error.
func upgradeHeaders(token string) http.Header {
	h := http.Header{
		"Connection":            {"Upgrade"},
		"Upgrade":               {"websocket"},
		"Sec-Websocket-Version": {"13"},
		"Sec-Websocket-Key":     {"dGhlIHNhbXBsZSBub25jZQ=="},
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return h
}

// TestControlPlaneNeedsToken: a `serve --listen 127.0.0.1:…` without a
// configured token used to accept anyone on /rpc/ws — a process in a
// sandbox could drive boxrt (read other sessions, widen
// allowed_mount_roots). Now boxrt generates a token into a 0600 file in
// its state directory and every route but the health probes requires it;
// every route refuses foreign Host and Origin headers (DNS rebinding).
func TestControlPlaneNeedsToken(t *testing.T) {
	p := Start(t, Options{Config: bwrapConfig})
	tokenFile := filepath.Join(p.State, "control-token")
	assert.NotEmpty(t, p.Token, "boxrt generated a control token in its state directory")

	t.Run("token file is private and announced by path only", func(t *testing.T) {
		fi, err := os.Stat(tokenFile)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		assert.Contains(t, p.Stderr(), tokenFile, "stderr says where the token is")
		assert.NotContains(t, p.Stderr(), p.Token, "the token itself is never logged")
	})

	relayPath := "/v1/sessions/s1/managed-process/default/ws"
	tests := []struct {
		name   string
		path   string
		host   string
		header http.Header
		status int
		typ    string
	}{
		{"rpc without token", "/rpc/ws", "", upgradeHeaders(""), http.StatusUnauthorized, "Unauthorized"},
		{"rpc wrong token", "/rpc/ws", "", upgradeHeaders("wrong-token-0123456789abcdefghijklmnop"), http.StatusUnauthorized, "Unauthorized"},
		{"relay without token", relayPath, "", upgradeHeaders(""), http.StatusUnauthorized, "Unauthorized"},
		{"metrics without token", "/metrics", "", nil, http.StatusUnauthorized, "Unauthorized"},
		{"rebinding host on rpc", "/rpc/ws", "evil.example:" + port(p.Addr), upgradeHeaders(p.Token), http.StatusForbidden, "Forbidden"},
		{"rebinding host on healthz", "/healthz", "evil.example", nil, http.StatusForbidden, "Forbidden"},
		{"rebinding host on readyz", "/readyz", "evil.example", nil, http.StatusForbidden, "Forbidden"},
		{"rebinding host on metrics", "/metrics", "evil.example", http.Header{"Authorization": {"Bearer " + p.Token}}, http.StatusForbidden, "Forbidden"},
		{"rebinding host on relay", relayPath, "evil.example", upgradeHeaders(p.Token), http.StatusForbidden, "Forbidden"},
		{"foreign origin on rpc", "/rpc/ws", "", withHeader(upgradeHeaders(p.Token), "Origin", "http://evil.example"), http.StatusForbidden, "Forbidden"},
		{"foreign origin on relay", relayPath, "", withHeader(upgradeHeaders(p.Token), "Origin", "http://evil.example"), http.StatusForbidden, "Forbidden"},
		{"null origin", "/rpc/ws", "", withHeader(upgradeHeaders(p.Token), "Origin", "null"), http.StatusForbidden, "Forbidden"},
		{"relay with the control token reaches the route", relayPath, "", upgradeHeaders(p.Token), http.StatusNotFound, "BoxSessionNotFoundError"},
		{"localhost name is fine", "/metrics", "localhost:" + port(p.Addr), http.Header{"Authorization": {"Bearer " + p.Token}}, http.StatusOK, ""},
		{"loopback origin is fine", "/metrics", "", http.Header{"Authorization": {"Bearer " + p.Token}, "Origin": {"http://127.0.0.1:3000"}}, http.StatusOK, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := httpGet(t, p.Addr, tc.path, tc.host, tc.header)
			assert.Equal(t, tc.status, status)
			if tc.typ != "" {
				require.NotNil(t, body, "a JSON error body")
				errObj, _ := body["error"].(map[string]any)
				assert.Equal(t, tc.typ, errObj["type"])
			}
		})
	}

	t.Run("health probes are open and say nothing else", func(t *testing.T) {
		for path, want := range map[string]string{"/healthz": "live", "/readyz": "ready"} {
			status, body := httpGet(t, p.Addr, path, "", nil)
			assert.Equal(t, http.StatusOK, status, path)
			assert.Equal(t, map[string]any{want: true}, body, path)
		}
	})

	t.Run("the generated token works", func(t *testing.T) {
		ws := DialWS(t, p.Addr, p.Token)
		require.Nil(t, ws.Call("__ping", map[string]any{}).Error)
	})

	t.Run("a restart reuses the token file", func(t *testing.T) {
		p.Stop()
		p2 := Start(t, Options{Config: bwrapConfig, StateDir: p.State})
		assert.Equal(t, p.Token, p2.Token)
		ws := DialWS(t, p2.Addr, p.Token)
		require.Nil(t, ws.Call("__ping", map[string]any{}).Error)
	})
}

// TestNoTokenWithoutUpgradeRefused: dialing with the websocket library (a
// real client, no token) fails with 401 instead of upgrading.
func TestNoTokenDialRefused(t *testing.T) {
	p := Start(t, Options{Config: bwrapConfig})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://"+p.Addr+"/rpc/ws", nil)
	if c != nil {
		c.CloseNow()
	}
	require.Error(t, err)
	require.NotNil(t, resp)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestAllowedHosts: a name added with --allowed-hosts (a reverse proxy's)
// is accepted in Host and Origin; others still are not.
func TestAllowedHosts(t *testing.T) {
	p := Start(t, Options{Config: bwrapConfig, Args: []string{"--allowed-hosts", "box.internal,proxy.example"}})
	tests := []struct {
		name, host, origin string
		status             int
	}{
		{"allowed host", "box.internal", "", http.StatusOK},
		{"allowed origin", "", "https://proxy.example", http.StatusOK},
		{"other host", "evil.example", "", http.StatusForbidden},
		{"other origin", "", "https://evil.example", http.StatusForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.origin != "" {
				h.Set("Origin", tc.origin)
			}
			status, _ := httpGet(t, p.Addr, "/healthz", tc.host, h)
			assert.Equal(t, tc.status, status)
		})
	}
}

func withHeader(h http.Header, k, v string) http.Header {
	h = h.Clone()
	h.Set(k, v)
	return h
}

func port(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }

// TestBackendInfoMeasuresIsolation: box_get_backend_info answers at once
// and, a moment later, carries the isolation measured in a probe sandbox
// of the running backend; the one-line summary stays a string.
func TestBackendInfoMeasuresIsolation(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	type report struct {
		Level             string   `json:"level"`
		KernelShared      bool     `json:"kernel_shared"`
		Seccomp           string   `json:"seccomp"`
		Capabilities      int      `json:"capabilities"`
		ReadOnlyRoot      bool     `json:"read_only_root"`
		NetworkInterfaces []string `json:"network_interfaces"`
		Error             string   `json:"error"`
	}
	var info struct {
		Isolation          string   `json:"isolation"`
		IsolationLevels    []string `json:"isolation_levels"`
		IsolationMeasured  []report `json:"isolation_measured"`
		IsolationMeasuring bool     `json:"isolation_measuring"`
	}
	require.Eventually(t, func() bool {
		p.MustCall("box_get_backend_info", map[string]any{}, &info)
		return !info.IsolationMeasuring
	}, time.Minute, 200*time.Millisecond)
	assert.NotEmpty(t, info.Isolation, "the summary")
	assert.Empty(t, info.IsolationLevels, "bwrap offers no stronger level")
	require.Len(t, info.IsolationMeasured, 1)
	got := info.IsolationMeasured[0]
	assert.Equal(t, report{Level: "", KernelShared: true, Seccomp: "filter", ReadOnlyRoot: true, NetworkInterfaces: []string{}}, got)
}
