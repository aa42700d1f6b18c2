package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bwrapConfig makes a runtime that needs no Docker engine.
const bwrapConfig = `{"backend":"bwrap"}`

func TestStdioPing(t *testing.T) {
	p := Start(t, Options{Stdio: true})
	r := p.Call("__ping", map[string]any{}, 10*time.Second)
	require.Nil(t, r.Error)
	assert.JSONEq(t, `{}`, string(r.Result))
}

// TestStdioBadInput sends each malformed message and checks the exact
// error, then that the process still answers.
func TestStdioBadInput(t *testing.T) {
	p := Start(t, Options{Stdio: true})
	deep := `{"jsonrpc":"2.0","id":7,"method":"__ping","params":{"a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`
	tests := []struct {
		name  string
		line  string
		id    string
		code  int64
		typ   string
		field string
	}{
		{name: "garbage bytes", line: "\x00\x01\x02garbage", id: "null", code: -32700, typ: "ParseError"},
		{name: "truncated JSON", line: `{"jsonrpc":"2.0","id":1,"method":"__pi`, id: "null", code: -32700, typ: "ParseError"},
		{name: "invalid UTF-8", line: "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"__ping\",\"params\":{\"x\":\"\xff\xfe\"}}", id: "null", code: -32700, typ: "ParseError"},
		{name: "deep nesting", line: deep, id: "null", code: -32700, typ: "ParseError"},
		{name: "jsonrpc 1.0", line: `{"jsonrpc":"1.0","id":3,"method":"__ping","params":{}}`, id: "3", code: -32600, typ: "InvalidRequest"},
		{name: "missing jsonrpc", line: `{"id":4,"method":"__ping"}`, id: "4", code: -32600, typ: "InvalidRequest"},
		{name: "method not a string", line: `{"jsonrpc":"2.0","id":5,"method":5}`, id: "5", code: -32600, typ: "InvalidRequest"},
		{name: "boolean id", line: `{"jsonrpc":"2.0","id":true,"method":"__ping"}`, id: "null", code: -32600, typ: "InvalidRequest"},
		{name: "batch", line: `[{"jsonrpc":"2.0","id":6,"method":"__ping"}]`, id: "null", code: -32600, typ: "InvalidRequest"},
		{name: "empty batch", line: `[]`, id: "null", code: -32600, typ: "InvalidRequest"},
		{name: "not an object", line: `42`, id: "null", code: -32600, typ: "InvalidRequest"},
		{name: "params as array", line: `{"jsonrpc":"2.0","id":"arr","method":"__ping","params":[1,2]}`, id: `"arr"`, code: -32602, typ: "BoxValidationError", field: "params"},
		{name: "unknown field", line: `{"jsonrpc":"2.0","id":8,"method":"box_get_session","params":{"session_id":"x","bogus":1}}`, id: "8", code: -32602, typ: "BoxValidationError", field: "bogus"},
		{name: "wrong type", line: `{"jsonrpc":"2.0","id":9,"method":"box_get_session","params":{"session_id":5}}`, id: "9", code: -32602, typ: "BoxValidationError", field: "session_id"},
		{name: "unknown method", line: `{"jsonrpc":"2.0","id":10,"method":"box_nope","params":{}}`, id: "10", code: -32601, typ: "MethodNotFound"},
		{name: "negative number id", line: `{"jsonrpc":"2.0","id":-12,"method":"box_nope"}`, id: "-12", code: -32601, typ: "MethodNotFound"},
		{name: "fractional id", line: `{"jsonrpc":"2.0","id":1.5,"method":"box_nope"}`, id: "1.5", code: -32601, typ: "MethodNotFound"},
		{name: "null id", line: `{"jsonrpc":"2.0","id":null,"method":"box_nope"}`, id: "null", code: -32601, typ: "MethodNotFound"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p.Send([]byte(tc.line + "\n"))
			var r Response
			require.NoError(t, json.Unmarshal(p.NextLine(10*time.Second), &r))
			require.NotNil(t, r.Error)
			assert.Equal(t, tc.id, string(r.ID))
			assert.Equal(t, tc.code, r.Error.Code)
			assert.Equal(t, tc.typ, r.Error.Type())
			assert.True(t, strings.HasPrefix(r.Error.Message, tc.typ+": "), r.Error.Message)
			assert.Equal(t, false, r.Error.Data["retryable"])
			if tc.field != "" {
				assert.Equal(t, tc.field, r.Error.Data["field"])
			}
			pong := p.Call("__ping", map[string]any{}, 10*time.Second)
			require.Nil(t, pong.Error, "the process keeps serving")
		})
	}

	t.Run("17 MiB line", func(t *testing.T) {
		big := append([]byte(`{"jsonrpc":"2.0","id":99,"method":"__ping","params":{"x":"`), bytes.Repeat([]byte("a"), 17<<20)...)
		big = append(big, []byte("\"}}\n")...)
		p.Send(big)
		var r Response
		require.NoError(t, json.Unmarshal(p.NextLine(30*time.Second), &r))
		require.NotNil(t, r.Error)
		assert.Equal(t, "null", string(r.ID))
		assert.Equal(t, int64(-32600), r.Error.Code)
		assert.Contains(t, r.Error.Message, "16777216")
		require.Nil(t, p.Call("__ping", map[string]any{}, 10*time.Second).Error)
	})

	t.Run("string and number ids echoed", func(t *testing.T) {
		p.Send([]byte(`{"jsonrpc":"2.0","id":"req-1","method":"__ping","params":{}}` + "\n" + `{"jsonrpc":"2.0","id":1e2,"method":"__ping"}` + "\n"))
		ids := map[string]bool{}
		for range 2 {
			var r Response
			require.NoError(t, json.Unmarshal(p.NextLine(10*time.Second), &r))
			require.Nil(t, r.Error)
			ids[string(r.ID)] = true
		}
		assert.Equal(t, map[string]bool{`"req-1"`: true, "1e2": true}, ids)
	})

	t.Run("notification gets no reply", func(t *testing.T) {
		p.Send([]byte(`{"jsonrpc":"2.0","method":"__ping","params":{}}` + "\n"))
		p.Send([]byte(`{"jsonrpc":"2.0","id":"after","method":"__ping","params":{}}` + "\n"))
		var r Response
		require.NoError(t, json.Unmarshal(p.NextLine(10*time.Second), &r))
		assert.Equal(t, `"after"`, string(r.ID), "the first line out answers the second request")
	})
	assert.NotContains(t, p.Stderr(), "panic")
}

func TestErrorCodes(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	tests := []struct {
		name   string
		method string
		params any
		code   int64
		typ    string
	}{
		{"session not found", "box_get_session", map[string]any{"session_id": "nope"}, -32004, "BoxSessionNotFoundError"},
		{"delete unknown", "box_delete_session", map[string]any{"session_id": "nope"}, -32004, "BoxSessionNotFoundError"},
		{"process of unknown session", "box_get_managed_process", map[string]any{"session_id": "nope"}, -32004, "BoxSessionNotFoundError"},
		{"validation", "box_exec", map[string]any{"session_id": "v", "cmd": "true", "timeout_sec": 0}, -32602, "BoxValidationError"},
		{"empty cmd", "box_exec", map[string]any{"session_id": "v", "cmd": "  "}, -32602, "BoxValidationError"},
		{"bad init", "box_init", map[string]any{"limits": map[string]any{"max_sessions": -1}}, -32602, "BoxValidationError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := p.Call(tc.method, tc.params, time.Minute)
			require.NotNil(t, r.Error, string(r.Result))
			assert.Equal(t, tc.code, r.Error.Code)
			assert.Equal(t, tc.typ, r.Error.Type())
			assert.True(t, strings.HasPrefix(r.Error.Message, tc.typ+": "))
		})
	}

	t.Run("conflict names the field", func(t *testing.T) {
		p.MustCall("box_create_session", map[string]any{"session_id": "c1"}, nil)
		r := p.Call("box_create_session", map[string]any{"session_id": "c1", "network": "on"}, time.Minute)
		require.NotNil(t, r.Error)
		assert.Equal(t, int64(-32003), r.Error.Code)
		assert.Equal(t, "network", r.Error.Data["field"])
		assert.Contains(t, r.Error.Message, "network=off")
	})
	t.Run("process not found", func(t *testing.T) {
		r := p.Call("box_get_managed_process", map[string]any{"session_id": "c1", "process_id": "x"}, time.Minute)
		require.NotNil(t, r.Error)
		assert.Equal(t, int64(-32006), r.Error.Code)
	})
	t.Run("capacity", func(t *testing.T) {
		p.MustCall("box_init", map[string]any{"limits": map[string]any{"max_sessions": 1}}, nil)
		r := p.Call("box_create_session", map[string]any{"session_id": "c2"}, time.Minute)
		require.NotNil(t, r.Error)
		assert.Equal(t, int64(-32007), r.Error.Code)
		assert.Equal(t, "max_sessions", r.Error.Data["limit"])
		assert.Equal(t, true, r.Error.Data["retryable"])
	})
	t.Run("init is atomic", func(t *testing.T) {
		r := p.Call("box_init", map[string]any{"limits": map[string]any{"max_sessions": 7, "max_managed_processes": 99999}}, time.Minute)
		require.NotNil(t, r.Error)
		assert.Equal(t, "limits.max_managed_processes", r.Error.Data["field"])
		var st struct {
			Limits struct {
				MaxSessions int `json:"max_sessions"`
			} `json:"limits"`
		}
		p.MustCall("box_status", map[string]any{}, &st)
		assert.Equal(t, 1, st.Limits.MaxSessions, "nothing of the invalid payload was applied")
	})
}

func TestBackendUnavailable(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: `{"backend":"docker"}`, Env: []string{"DOCKER_HOST=unix:///nonexistent/docker.sock"}})
	r := p.Call("box_exec", map[string]any{"session_id": "x", "cmd": "true"}, time.Minute)
	require.NotNil(t, r.Error)
	assert.Equal(t, int64(-32001), r.Error.Code)
	assert.Equal(t, "BoxBackendUnavailableError", r.Error.Type())
	var info map[string]any
	p.MustCall("box_get_backend_info", map[string]any{}, &info)
	assert.Nil(t, info["name"])
	assert.Equal(t, false, info["available"])
}

func TestOutOfOrder(t *testing.T) {
	p := Start(t, Options{Stdio: true, Config: bwrapConfig})
	p.MustCall("box_create_session", map[string]any{"session_id": "slow"}, nil)
	p.Send([]byte(`{"jsonrpc":"2.0","id":"slow","method":"box_exec","params":{"session_id":"slow","cmd":"sleep 1; echo done"}}` + "\n" +
		`{"jsonrpc":"2.0","id":"fast","method":"__ping","params":{}}` + "\n"))
	var first, second Response
	require.NoError(t, json.Unmarshal(p.NextLine(time.Minute), &first))
	require.NoError(t, json.Unmarshal(p.NextLine(time.Minute), &second))
	assert.Equal(t, `"fast"`, string(first.ID))
	assert.Equal(t, `"slow"`, string(second.ID))
	var res map[string]any
	require.NoError(t, json.Unmarshal(second.Result, &res))
	assert.Equal(t, "done\n", res["stdout"])
}

func TestStdinEOFExits(t *testing.T) {
	p := Start(t, Options{Stdio: true})
	require.Nil(t, p.Call("__ping", map[string]any{}, 10*time.Second).Error)
	start := time.Now()
	p.CloseStdin()
	code, ok := p.Wait(5 * time.Second)
	require.True(t, ok, "boxrt must exit within 5 s of stdin EOF")
	assert.Equal(t, 0, code)
	t.Logf("exited %v after EOF", time.Since(start))
}

func TestRefuseNonLoopbackWithoutToken(t *testing.T) {
	cmd := exec.Command(binPath, "serve", "--listen", "0.0.0.0:0", "--state-dir", t.TempDir())
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Equal(t, 2, cmd.ProcessState.ExitCode())
	assert.Contains(t, string(out), "refusing to listen on 0.0.0.0:0 without a control token")
}

// Every configured control token must be at least 32 characters: a short
// one stops boxrt at start with exit 2 and an error that names where the
// token came from and how long it was, never the token itself.
func TestShortControlTokenRefused(t *testing.T) {
	short := "only-twenty-chars-xx"
	ok := strings.Repeat("k", 32)
	file := func(content string) string {
		path := t.TempDir() + "/token"
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}
	shortFile, okFile, spaceFile := file(short+"\n"), file(ok+"\n"), file(ok+" "+ok)
	tests := []struct {
		name    string
		env     []string
		args    []string
		wantErr string // "" = boxrt starts
	}{
		{name: "BOXRT_CONTROL_TOKEN too short", env: []string{"BOXRT_CONTROL_TOKEN=" + short},
			wantErr: "BOXRT_CONTROL_TOKEN: the control token is 20 characters long; it must be at least 32"},
		{name: "LANGBOT_BOX_CONTROL_TOKEN too short", env: []string{"LANGBOT_BOX_CONTROL_TOKEN=" + short},
			wantErr: "LANGBOT_BOX_CONTROL_TOKEN: the control token is 20 characters long; it must be at least 32"},
		{name: "--token-file too short", args: []string{"--token-file", shortFile},
			wantErr: "--token-file " + shortFile + ": the control token is 20 characters long; it must be at least 32"},
		{name: "--token-file with whitespace inside", args: []string{"--token-file", spaceFile},
			wantErr: "--token-file " + spaceFile + ": the control token must not contain whitespace"},
		{name: "--token-file wins over a short environment token", env: []string{"BOXRT_CONTROL_TOKEN=" + short},
			args: []string{"--token-file", okFile}},
		{name: "exactly 32 characters", env: []string{"BOXRT_CONTROL_TOKEN=" + ok}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--stdio"}, tc.args...)
			cmd := exec.Command(binPath, args...)
			cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()}, tc.env...)
			if tc.wantErr == "" {
				// Started: it answers a ping on stdin, then exits at EOF.
				cmd.Stdin = strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"__ping","params":{}}` + "\n")
				out, err := cmd.Output()
				require.NoError(t, err)
				assert.JSONEq(t, `{"jsonrpc":"2.0","id":1,"result":{}}`, strings.TrimSpace(string(out)))
				return
			}
			out, err := cmd.CombinedOutput()
			require.Error(t, err)
			assert.Equal(t, 2, cmd.ProcessState.ExitCode())
			assert.Contains(t, string(out), tc.wantErr)
			assert.NotContains(t, string(out), short, "the token itself is never printed")
		})
	}
}

func TestBusyPort(t *testing.T) {
	p := Start(t, Options{})
	cmd := exec.Command(binPath, "serve", "--listen", p.Addr, "--state-dir", t.TempDir())
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "cannot listen on "+p.Addr)
}

func TestWebSocket(t *testing.T) {
	const token = "test-token-0123456789-abcdefghijklmnop"
	p := Start(t, Options{Env: []string{"BOXRT_CONTROL_TOKEN=" + token}})

	t.Run("401 without token", func(t *testing.T) {
		for _, h := range []http.Header{{}, {"Authorization": {"Bearer wrong"}}} {
			req, _ := http.NewRequest("GET", "http://"+p.Addr+"/rpc/ws", nil)
			req.Header = h
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		}
		resp, err := http.Get("http://" + p.Addr + "/rpc/ws?token=" + token)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a token in the URL is never accepted")
		assert.NotContains(t, p.Stderr(), token, "the token is never logged")
	})

	t.Run("ping and status", func(t *testing.T) {
		ws := DialWS(t, p.Addr, token)
		r := ws.Call("__ping", map[string]any{})
		require.Nil(t, r.Error)
		r = ws.Call("box_status", map[string]any{})
		require.Nil(t, r.Error)
		var st map[string]any
		require.NoError(t, json.Unmarshal(r.Result, &st))
		assert.Contains(t, st, "uptime_sec")
		assert.Equal(t, "http://"+p.Addr, st["relay_url"])
		r = ws.Call("box_health", map[string]any{})
		require.Nil(t, r.Error)
		assert.NotContains(t, string(r.Result), "relay_token", "the relay token is only returned over stdio")
	})

	t.Run("subprotocol token", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws://"+p.Addr+"/rpc/ws", &websocket.DialOptions{
			Subprotocols: []string{"mcp", "boxrt.bearer." + base64url(token)}})
		require.NoError(t, err)
		assert.Equal(t, "mcp", c.Subprotocol())
		c.CloseNow()
	})

	t.Run("bad frames keep the socket", func(t *testing.T) {
		ws := DialWS(t, p.Addr, token)
		ws.Send([]byte(`{"jsonrpc":"2.0","id":1,"method"`))
		r := ws.Read(10 * time.Second)
		assert.Equal(t, int64(-32700), r.Error.Code)
		require.Nil(t, ws.Call("__ping", map[string]any{}).Error)
	})

	t.Run("binary frame closes with 1003", func(t *testing.T) {
		ws := DialWS(t, p.Addr, token)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, ws.C.Write(ctx, websocket.MessageBinary, []byte(`{"jsonrpc":"2.0","id":1,"method":"__ping"}`)))
		_, _, err := ws.C.Read(ctx)
		assert.Equal(t, websocket.StatusUnsupportedData, websocket.CloseStatus(err))
	})

	t.Run("17 MiB message closes with 1009", func(t *testing.T) {
		ws := DialWS(t, p.Addr, token)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		big := append([]byte(`{"jsonrpc":"2.0","id":1,"method":"__ping","params":{"x":"`), bytes.Repeat([]byte("a"), 17<<20)...)
		_ = ws.C.Write(ctx, websocket.MessageText, append(big, `"}}`...))
		_, _, err := ws.C.Read(ctx)
		assert.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(err))
		// The process is still up.
		ws2 := DialWS(t, p.Addr, token)
		require.Nil(t, ws2.Call("__ping", map[string]any{}).Error)
	})

	t.Run("many clients", func(t *testing.T) {
		done := make(chan error, 16)
		for range 16 {
			go func() {
				ws := DialWS(t, p.Addr, token)
				for range 20 {
					if r := ws.Call("__ping", map[string]any{}); r.Error != nil {
						done <- fmt.Errorf("%s", r.Error.Message)
						return
					}
				}
				done <- nil
			}()
		}
		for range 16 {
			require.NoError(t, <-done)
		}
	})
}

func TestHealthEndpoints(t *testing.T) {
	p := Start(t, Options{Config: bwrapConfig})
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + p.Addr + path)
		require.NoError(t, err)
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	}
}

// TestKeepaliveFreesDeadPeer: a client that stops answering pings is
// detected and its connection closed by the server.
func TestKeepaliveFreesDeadPeer(t *testing.T) {
	const token = "keepalive-token-0123456789abcdefghijklmn"
	p := Start(t, Options{Env: []string{"BOXRT_CONTROL_TOKEN=" + token}, Args: []string{"--keepalive", "300ms"}})
	ws := DialWS(t, p.Addr, token)
	require.Nil(t, ws.Call("__ping", map[string]any{}).Error)
	// Not reading means pongs are never sent: the peer looks dead.
	require.Eventually(t, func() bool {
		return strings.Contains(p.Stderr(), "websocket peer did not answer a ping")
	}, 10*time.Second, 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := ws.C.Read(ctx)
	assert.Error(t, err, "the server closed the connection")
}

func TestConfigFileYAML(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/boxrt.yaml"
	require.NoError(t, os.WriteFile(path, []byte("backend: bwrap\nlimits:\n  max_sessions: 7\n  session_ttl_sec: 42\n"), 0o600))
	p := Start(t, Options{Stdio: true, Args: []string{"--config", path}, Config: `{"limits":{"max_sessions":9}}`})
	var st struct {
		SessionTTL int `json:"session_ttl_sec"`
		Limits     struct {
			MaxSessions int `json:"max_sessions"`
		} `json:"limits"`
	}
	p.MustCall("box_status", map[string]any{}, &st)
	assert.Equal(t, 42, st.SessionTTL, "from the file")
	assert.Equal(t, 9, st.Limits.MaxSessions, "BOXRT_CONFIG is applied after the file")

	bad := exec.Command(binPath, "serve", "--stdio", "--listen", "", "--state-dir", t.TempDir())
	bad.Env = append(os.Environ(), `BOXRT_CONFIG={"limits":{"max_sessions":-3}}`)
	out, err := bad.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "limits.max_sessions must be between 0 and 5000")
}
