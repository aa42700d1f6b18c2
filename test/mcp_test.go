package test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mcpOutcome is the JSON line test/mcp/scenario.mjs prints when every
// step passed.
type mcpOutcome struct {
	Session   string `json:"session"`
	Progress  int    `json:"progress"`
	Cancelled string `json:"cancelled"`
}

// runMCPScenario runs the official TypeScript MCP SDK's client through
// scenario.mjs (its assertions: tools listed, a command with progress
// while it runs, a file written and read, a failing command, boxrt's
// error, cancellation) and returns its outcome and its stderr, where in
// stdio mode boxrt's logs are.
func runMCPScenario(t *testing.T, mode string, env ...string) (mcpOutcome, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sdkNode(), "scenario.mjs", mode)
	cmd.Dir = npmPackages(t, "mcp")
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "scenario.mjs %s:\nstdout: %s\nstderr: %s", mode, stdout.String(), lastLines(stderr.String(), 80))
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var out mcpOutcome
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &out), stdout.String())
	assert.Regexp(t, `^mcp-[0-9a-f]{12}$`, out.Session)
	assert.GreaterOrEqual(t, out.Progress, 1)
	assert.NotEmpty(t, out.Cancelled)
	return out, stderr.String()
}

// TestMCPServer drives `boxrt mcp` with the official TypeScript MCP SDK on
// each backend, over stdio (the SDK spawns boxrt) and over Streamable
// HTTP (--listen, the control token as Bearer).
func TestMCPServer(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		cfg := "{" + backendConfigs[backend] + "}"
		t.Run(backend+"/stdio", func(t *testing.T) {
			state := t.TempDir()
			t.Cleanup(func() { reapSandboxes(t, state) })
			removeInstanceContainers(t, state)
			out, logs := runMCPScenario(t, "stdio", "BOXRT_BIN="+binPath, "BOXRT_STATE_DIR="+state, "BOXRT_CONFIG="+cfg)
			// The connection's session was deleted when it ended.
			assert.True(t, loggedDeletion(logs, out.Session), "no deletion of %s logged:\n%s", out.Session, lastLines(logs, 40))
			assert.Contains(t, logs, `"message":"stdin closed; shutting down"`)
			assert.Contains(t, logs, `"status":"canceled"`, "the cancelled command was killed")
		})
		t.Run(backend+"/http", func(t *testing.T) {
			state := t.TempDir()
			removeInstanceContainers(t, state) // the persistent session, should the test end early
			p := Start(t, Options{Command: "mcp", Config: cfg, StateDir: state})
			require.NotEmpty(t, p.Token)
			url := "http://" + p.Addr + "/mcp"
			resp, err := http.Post(url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "/mcp without the control token")

			out, _ := runMCPScenario(t, "http", "MCP_URL="+url, "MCP_TOKEN="+p.Token)
			ws := DialWS(t, p.Addr, p.Token)
			require.Eventually(t, func() bool {
				ids := sessionIDs(t, ws)
				return !ids[out.Session] && ids["kept"]
			}, 20*time.Second, 100*time.Millisecond, "the connection's session deleted when it ended, the persistent one kept")
			r := ws.Call("box_delete_session", map[string]any{"session_id": "kept"})
			require.Nil(t, r.Error)
			assert.True(t, loggedDeletion(p.Stderr(), out.Session))
			assert.Contains(t, p.Stderr(), `"status":"canceled"`, "the cancelled command was killed")
		})
	}
}

// loggedDeletion reports whether logs hold the runtime's line saying
// session id was destroyed by a delete.
func loggedDeletion(logs, id string) bool {
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"message":"session destroyed"`) && strings.Contains(line, `"reason":"delete"`) &&
			strings.Contains(line, `"session_id":"`+id+`"`) {
			return true
		}
	}
	return false
}

func sessionIDs(t *testing.T, ws *WS) map[string]bool {
	r := ws.Call("box_get_sessions", map[string]any{})
	require.Nil(t, r.Error)
	var res struct {
		Sessions []struct {
			SessionID string `json:"session_id"`
		} `json:"sessions"`
	}
	require.NoError(t, json.Unmarshal(r.Result, &res))
	ids := map[string]bool{}
	for _, s := range res.Sessions {
		ids[s.SessionID] = true
	}
	return ids
}
