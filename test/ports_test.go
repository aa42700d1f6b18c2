package test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// portBackends are the backends that reach a session's ports, with an
// image that has python3.
var portBackends = map[string]string{
	"bwrap":  `"backend":"bwrap"`,
	"docker": `"backend":"docker","docker":{"image":"boxrt-sandbox:latest"}`,
}

// portEnv is a stdio boxrt with one session (network off) serving
// python3's http.server on 8000 and a WebSocket echo server on 8001.
type portEnv struct {
	p   *Proc
	sid string
}

type exposure struct {
	SessionID string    `json:"session_id"`
	Port      int       `json:"port"`
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

func newPortEnv(t *testing.T, backend string) *portEnv {
	t.Helper()
	p := Start(t, Options{Stdio: true, Config: fmt.Sprintf(`{%s,"limits":{"session_ttl_sec":300}}`, portBackends[backend])})
	e := &portEnv{p: p, sid: "web"}
	p.MustCall("box_create_session", map[string]any{"session_id": e.sid, "network": "off"}, nil)
	t.Cleanup(func() { p.Call("box_delete_session", map[string]any{"session_id": e.sid}, time.Minute) })
	ws, err := os.ReadFile("fixtures/wsecho/wsecho.py")
	require.NoError(t, err)
	p.MustCall("box_fs_write", map[string]any{"session_id": e.sid, "path": "/tmp/wsecho.py", "data_base64": base64.StdEncoding.EncodeToString(ws)}, nil)
	e.exec(t, "mkdir -p /tmp/www && echo hello > /tmp/www/hello.txt && head -c 5242880 /dev/urandom > /tmp/www/big.bin")
	for _, proc := range []struct {
		id   string
		args []string
	}{
		{"http", []string{"-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp/www"}},
		{"ws", []string{"/tmp/wsecho.py", "8001"}},
	} {
		p.MustCall("box_start_managed_process", map[string]any{"session_id": e.sid,
			"spec": map[string]any{"process_id": proc.id, "command": "python3", "args": proc.args, "cwd": "/tmp"}}, nil)
	}
	// Both listen once a connection from inside the session succeeds.
	e.exec(t, `for i in $(seq 100); do python3 -c 'import socket; [socket.create_connection(("127.0.0.1", p), 1).close() for p in (8000, 8001)]' 2>/dev/null && exit 0; sleep 0.1; done; exit 1`)
	return e
}

// exec runs cmd in the session and requires exit 0; it returns stdout.
func (e *portEnv) exec(t *testing.T, cmd string) string {
	t.Helper()
	var res struct {
		ExitCode *int   `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	e.p.MustCall("box_exec", map[string]any{"session_id": e.sid, "cmd": cmd, "timeout_sec": 60}, &res)
	require.NotNil(t, res.ExitCode, "%s: %s", cmd, res.Stderr)
	require.Equal(t, 0, *res.ExitCode, "%s: %s", cmd, res.Stderr)
	return res.Stdout
}

func (e *portEnv) expose(t *testing.T, port, ttl int) exposure {
	t.Helper()
	params := map[string]any{"session_id": e.sid, "port": port}
	if ttl > 0 {
		params["ttl_sec"] = ttl
	}
	var x exposure
	e.p.MustCall("box_expose_port", params, &x)
	require.Equal(t, fmt.Sprintf("http://%s/v1/sessions/%s/ports/%d/", e.p.Addr, e.sid, port), x.URL)
	require.NotEmpty(t, x.Token)
	return x
}

// get requests url with the token in the header (none when ""), and
// returns the status and body.
func portGet(t *testing.T, method, url, token string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("X-Boxrt-Port-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, body, resp.Header
}

func TestPortsProxy(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortEnv(t, backend)
			x := e.expose(t, 8000, 0)
			assert.WithinDuration(t, time.Now().Add(time.Hour), x.ExpiresAt, time.Minute)

			status, body, _ := portGet(t, "GET", x.URL+"hello.txt", x.Token)
			require.Equal(t, http.StatusOK, status, "%s", body)
			assert.Equal(t, "hello\n", string(body))

			// 5 MiB, byte for byte.
			status, body, _ = portGet(t, "GET", x.URL+"big.bin", x.Token)
			require.Equal(t, http.StatusOK, status)
			require.Len(t, body, 5<<20)
			sum := sha256.Sum256(body)
			assert.Equal(t, hex.EncodeToString(sum[:]), strings.Fields(e.exec(t, "sha256sum /tmp/www/big.bin"))[0])

			// Any method reaches the server: http.server answers POST 501.
			status, _, _ = portGet(t, "POST", x.URL+"hello.txt", x.Token)
			assert.Equal(t, http.StatusNotImplemented, status)

			// A browser link: ?token= works and leaves a cookie for the
			// port's path, which the page's next requests carry.
			resp, err := http.Get(x.URL + "hello.txt?token=" + x.Token)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			var cookie *http.Cookie
			for _, c := range resp.Cookies() {
				if c.Name == "boxrt_port_token" {
					cookie = c
				}
			}
			require.NotNil(t, cookie)
			assert.Equal(t, "/v1/sessions/web/ports/8000/", cookie.Path)
			req, _ := http.NewRequest("GET", x.URL+"hello.txt", nil)
			req.AddCookie(&http.Cookie{Name: cookie.Name, Value: cookie.Value})
			resp, err = http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)

			// Refusals: no token, a wrong one, the control token, another
			// port's token.
			status, body, _ = portGet(t, "GET", x.URL+"hello.txt", "")
			assert.Equal(t, http.StatusUnauthorized, status)
			assert.True(t, json.Valid(body), "%s", body)
			status, _, _ = portGet(t, "GET", x.URL+"hello.txt", x.Token[:len(x.Token)-2]+"AA")
			assert.Equal(t, http.StatusUnauthorized, status)
			req, _ = http.NewRequest("GET", x.URL+"hello.txt", nil)
			req.Header.Set("Authorization", "Bearer "+e.p.Token)
			resp, err = http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

			// WebSocket, echoed through the upgrade.
			wx := e.expose(t, 8001, 0)
			status, _, _ = portGet(t, "GET", strings.Replace(wx.URL, "8001", "8000", 1)+"hello.txt", wx.Token)
			assert.Equal(t, http.StatusUnauthorized, status, "a token opens its own port only")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(wx.URL, "http")+"echo",
				&websocket.DialOptions{HTTPHeader: http.Header{"X-Boxrt-Port-Token": {wx.Token}}})
			require.NoError(t, err)
			c.SetReadLimit(1 << 20)
			for _, msg := range []string{"ping", strings.Repeat("x", 100000)} {
				require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(msg)))
				typ, got, err := c.Read(ctx)
				require.NoError(t, err)
				assert.Equal(t, websocket.MessageText, typ)
				assert.Equal(t, msg, string(got))
			}
			c.Close(websocket.StatusNormalClosure, "")

			// Nobody listens on 8002: 502 with a JSON error.
			nx := e.expose(t, 8002, 0)
			status, body, hdr := portGet(t, "GET", nx.URL, nx.Token)
			assert.Equal(t, http.StatusBadGateway, status)
			assert.Equal(t, "application/json", hdr.Get("Content-Type"))
			var perr struct {
				Error struct{ Type, Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal(body, &perr), "%s", body)
			assert.Contains(t, perr.Error.Message, "8002")

			// Expiry.
			short := e.expose(t, 8000, 1)
			time.Sleep(2100 * time.Millisecond)
			status, _, _ = portGet(t, "GET", short.URL+"hello.txt", short.Token)
			assert.Equal(t, http.StatusUnauthorized, status, "expired")

			// Unexpose revokes; exposing again gives a new token.
			x = e.expose(t, 8000, 0)
			status, _, _ = portGet(t, "GET", x.URL+"hello.txt", x.Token)
			require.Equal(t, http.StatusOK, status)
			var un struct {
				Unexposed bool `json:"unexposed"`
			}
			e.p.MustCall("box_unexpose_port", map[string]any{"session_id": e.sid, "port": 8000}, &un)
			assert.True(t, un.Unexposed)
			status, _, _ = portGet(t, "GET", x.URL+"hello.txt", x.Token)
			assert.Equal(t, http.StatusUnauthorized, status, "unexposed")

			// Deleting the session revokes its exposures.
			x = e.expose(t, 8000, 0)
			e.p.MustCall("box_delete_session", map[string]any{"session_id": e.sid}, nil)
			status, _, _ = portGet(t, "GET", x.URL+"hello.txt", x.Token)
			assert.Equal(t, http.StatusUnauthorized, status, "session deleted")
		})
	}
}

func TestPortsValidation(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	for _, c := range []struct {
		params map[string]any
		field  string
	}{
		{map[string]any{"session_id": "x", "port": 0}, "port"},
		{map[string]any{"session_id": "x", "port": 70000}, "port"},
		{map[string]any{"session_id": "x", "port": 80, "ttl_sec": -1}, "ttl_sec"},
		{map[string]any{"session_id": "x", "port": 80, "ttl_sec": 10 * 86400}, "ttl_sec"},
		{map[string]any{"port": 80}, "session_id"},
	} {
		r := p.Call("box_expose_port", c.params, time.Minute)
		require.NotNil(t, r.Error, "%v", c.params)
		assert.Equal(t, "BoxValidationError", r.Error.Type(), "%v", c.params)
		assert.Equal(t, c.field, r.Error.Data["field"], "%v", c.params)
	}
	r := p.Call("box_expose_port", map[string]any{"session_id": "nope", "port": 80}, time.Minute)
	require.NotNil(t, r.Error)
	assert.Equal(t, "BoxSessionNotFoundError", r.Error.Type())
	var un struct {
		Unexposed bool `json:"unexposed"`
	}
	p.MustCall("box_unexpose_port", map[string]any{"session_id": "nope", "port": 80}, &un)
	assert.False(t, un.Unexposed)
}
