package test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRuntimeRestartWithRelay restarts boxrt under a host that holds a relay
// socket: the socket is closed with 1001, the persistent session is
// re-adopted by the new process, and the host re-attaches to a new process.
func TestRuntimeRestartWithRelay(t *testing.T) {
	const token = "restart-token-0123456789abcdefghijklmnop"
	state := t.TempDir()
	removeInstanceContainers(t, state)
	opts := Options{StateDir: state, Env: []string{"BOXRT_CONTROL_TOKEN=" + token},
		Config: "{" + backendConfigs["docker"] + "}"}
	p := Start(t, opts)
	ws := DialWS(t, p.Addr, token)
	mustWS(t, ws, "box_create_session", map[string]any{"session_id": "held", "persistent": true})
	mustWS(t, ws, "box_exec", map[string]any{"session_id": "held", "persistent": true, "cmd": "echo kept > /workspace/f"})
	mustWS(t, ws, "box_start_managed_process", map[string]any{"session_id": "held", "spec": map[string]any{"command": "cat"}})

	relay := dialRelay(t, p.Addr, token, "held")
	writeText(t, relay, "before")
	assert.Equal(t, "before", readText(t, relay))

	p.Stop() // SIGTERM-equivalent graceful stop
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := relay.Read(ctx)
	assert.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "the relay client is told the runtime went away (%v)", err)

	opts.Addr = p.Addr // same address: the host redials what it knows
	p2 := Start(t, opts)
	ws2 := DialWS(t, p2.Addr, token)
	r := ws2.Call("box_get_managed_process", map[string]any{"session_id": "held"})
	require.NotNil(t, r.Error, "managed processes do not outlive the runtime")
	assert.Equal(t, int64(-32006), r.Error.Code, "but the re-adopted session is there")
	out := mustWS(t, ws2, "box_exec", map[string]any{"session_id": "held", "persistent": true, "cmd": "cat /workspace/f"})
	assert.Contains(t, string(out), `"stdout":"kept\n"`)

	mustWS(t, ws2, "box_start_managed_process", map[string]any{"session_id": "held", "spec": map[string]any{"command": "cat"}})
	relay2 := dialRelay(t, p2.Addr, token, "held")
	writeText(t, relay2, "after")
	assert.Equal(t, "after", readText(t, relay2))
	mustWS(t, ws2, "box_delete_session", map[string]any{"session_id": "held"})
}

func mustWS(t *testing.T, ws *WS, method string, params any) []byte {
	t.Helper()
	r := ws.Call(method, params)
	require.Nil(t, r.Error, "%s: %+v", method, r.Error)
	return r.Result
}

func dialRelay(t *testing.T, addr, token, sid string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/sessions/"+sid+"/managed-process/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	require.NoError(t, err)
	t.Cleanup(func() { c.CloseNow() })
	return c
}
