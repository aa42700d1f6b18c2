package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backendConfigs are the real backends every relay scenario runs on:
// bwrap, docker with the engine's default runtime, and docker with gVisor
// (runsc, registered by scripts/setup), so that sessions, relay, managed
// processes and skill mounts are shown to work under gVisor too.
var backendConfigs = map[string]string{
	"bwrap":  `"backend":"bwrap"`,
	"docker": `"backend":"docker","docker":{"image":"boxrt-test:busybox"}`,
	// docker-default: the default image, boxrt-sandbox:latest, as a new
	// user's sessions get it.
	"docker-default": `"backend":"docker"`,
	"docker-runsc":   `"backend":"docker","docker":{"image":"boxrt-test:busybox","runtime":"runsc"}`,
}

// relayEnv is a stdio boxrt with a workspace directory the sandbox sees at
// /workspace, the control token it returned, and the relay token of each
// process started through it.
type relayEnv struct {
	p     *Proc
	ws    string // host side of /workspace
	token string
	mu    sync.Mutex
	procs map[string]string // "session/process" → relay_token
}

func newRelayEnv(t *testing.T, backend string, extraLimits string, env ...string) *relayEnv {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.Chmod(root, 0o755))
	ws := filepath.Join(root, "ws")
	require.NoError(t, os.MkdirAll(ws, 0o777))
	require.NoError(t, os.Chmod(ws, 0o777)) // the docker image's user is uid 1000
	limits := `"session_ttl_sec":300`
	if extraLimits != "" {
		limits += "," + extraLimits
	}
	cfg := fmt.Sprintf(`{%s,"local":{"allowed_mount_roots":[%q]},"limits":{%s}}`, backendConfigs[backend], root, limits)
	p := Start(t, Options{Stdio: true, Config: cfg, Env: env})
	var health struct {
		RelayToken string `json:"relay_token"`
	}
	p.MustCall("box_health", map[string]any{}, &health)
	require.NotEmpty(t, health.RelayToken, "stdio mode without a token generates one")
	return &relayEnv{p: p, ws: ws, token: health.RelayToken, procs: map[string]string{}}
}

func (e *relayEnv) session(t *testing.T, id string) {
	t.Helper()
	e.p.MustCall("box_create_session", map[string]any{"session_id": id, "host_path": e.ws}, nil)
	t.Cleanup(func() { e.p.Call("box_delete_session", map[string]any{"session_id": id}, time.Minute) })
}

func (e *relayEnv) start(t *testing.T, sid, pid, command string, args ...string) map[string]any {
	t.Helper()
	var info map[string]any
	e.p.MustCall("box_start_managed_process", map[string]any{"session_id": sid,
		"spec": map[string]any{"process_id": pid, "command": command, "args": args, "env": map[string]string{"SECRET_VALUE": "hunter2"}}}, &info)
	tok, _ := info["relay_token"].(string)
	require.NotEmpty(t, tok, "every started process gets its own relay token")
	e.mu.Lock()
	e.procs[sid+"/"+pid] = tok
	e.mu.Unlock()
	return info
}

// relayToken is the relay token of the process last started as sid/pid.
func (e *relayEnv) relayToken(sid, pid string) string {
	if pid == "" {
		pid = "default"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.procs[sid+"/"+pid]
}

func (e *relayEnv) url(sid, pid string) string {
	u := "ws://" + e.p.Addr + "/v1/sessions/" + sid + "/managed-process"
	if pid != "" {
		u += "/" + pid
	}
	return u + "/ws"
}

// dial attaches with the process's own relay token, the credential a host
// hands its MCP client.
func (e *relayEnv) dial(t *testing.T, sid, pid string) (*websocket.Conn, *http.Response) {
	t.Helper()
	tok := e.relayToken(sid, pid)
	require.NotEmpty(t, tok, "no process %s/%s was started", sid, pid)
	return e.dialWith(t, sid, pid, tok)
}

func (e *relayEnv) dialWith(t *testing.T, sid, pid, token string) (*websocket.Conn, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, e.url(sid, pid), &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}, Subprotocols: []string{"mcp"}})
	require.NoError(t, err)
	c.SetReadLimit(32 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return c, resp
}

func readText(t *testing.T, c *websocket.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	typ, data, err := c.Read(ctx)
	require.NoError(t, err)
	require.Equal(t, websocket.MessageText, typ)
	return string(data)
}

func writeText(t *testing.T, c *websocket.Conn, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Write(ctx, websocket.MessageText, []byte(s)))
}

// wireBackend is the backend name boxrt reports for an entry of
// backendConfigs ("docker-runsc" is the docker backend).
func wireBackend(entry string) string {
	name, _, _ := strings.Cut(entry, "-")
	return name
}

func eachBackend(t *testing.T, f func(t *testing.T, backend string)) {
	for _, b := range []string{"bwrap", "docker", "docker-runsc"} {
		t.Run(b, func(t *testing.T) { f(t, b) })
	}
}

func TestRelayLifecycle(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		e := newRelayEnv(t, backend, "")
		e.session(t, "life")
		info := e.start(t, "life", "echo", "cat")
		assert.Equal(t, "running", info["status"])
		assert.Equal(t, []any{"SECRET_VALUE"}, info["env_keys"])
		assert.NotContains(t, fmt.Sprint(info), "hunter2", "env values are never returned")

		c, resp := e.dial(t, "life", "echo")
		assert.Equal(t, "mcp", c.Subprotocol())
		assert.Equal(t, "0", resp.Header.Get("X-Boxrt-Replay-Lines"))
		writeText(t, c, `{"jsonrpc":"2.0","id":1,"method":"ping"}`)
		assert.Equal(t, `{"jsonrpc":"2.0","id":1,"method":"ping"}`, readText(t, c))
		var got map[string]any
		e.p.MustCall("box_get_managed_process", map[string]any{"session_id": "life", "process_id": "echo"}, &got)
		assert.Equal(t, true, got["attached"])

		e.p.MustCall("box_stop_managed_process", map[string]any{"session_id": "life", "process_id": "echo"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _, err := c.Read(ctx)
		assert.Equal(t, websocket.StatusNormalClosure, websocket.CloseStatus(err), "stopping the process closes its relay")
		r := e.p.Call("box_get_managed_process", map[string]any{"session_id": "life", "process_id": "echo"}, time.Minute)
		require.NotNil(t, r.Error)
		assert.Equal(t, int64(-32006), r.Error.Code)

		// A process that exits on its own reports its code.
		e.start(t, "life", "quitter", "sh", "-c", "echo bye >&2; exit 3")
		require.Eventually(t, func() bool {
			e.p.MustCall("box_get_managed_process", map[string]any{"session_id": "life", "process_id": "quitter"}, &got)
			return got["status"] == "exited"
		}, 30*time.Second, 100*time.Millisecond)
		assert.Equal(t, float64(3), got["exit_code"])
		assert.Equal(t, "bye", got["stderr_preview"])
		assert.NotNil(t, got["exited_at"])

		var sess map[string]any
		e.p.MustCall("box_get_session", map[string]any{"session_id": "life"}, &sess)
		assert.Contains(t, sess["managed_processes"], "quitter", "box_get_session lists the session's processes")
	})
}

func TestRelayPreUpgradeErrors(t *testing.T) {
	e := newRelayEnv(t, "bwrap", "")
	e.session(t, "pre")
	e.start(t, "pre", "done", "true")
	require.Eventually(t, func() bool {
		var got map[string]any
		e.p.MustCall("box_get_managed_process", map[string]any{"session_id": "pre", "process_id": "done"}, &got)
		return got["status"] == "exited"
	}, 30*time.Second, 50*time.Millisecond)
	tests := []struct {
		name, sid, pid, token string
		status                int
		typ                   string
	}{
		{"no token", "pre", "done", "", http.StatusUnauthorized, "Unauthorized"},
		{"process token on an unknown session", "nope", "done", e.relayToken("pre", "done"), http.StatusUnauthorized, "Unauthorized"},
		{"process token on an unknown process", "pre", "x", e.relayToken("pre", "done"), http.StatusUnauthorized, "Unauthorized"},
		{"process token of an exited process", "pre", "done", e.relayToken("pre", "done"), http.StatusConflict, "BoxManagedProcessConflictError"},
		{"unknown session", "nope", "x", e.token, http.StatusNotFound, "BoxSessionNotFoundError"},
		{"unknown process", "pre", "x", e.token, http.StatusNotFound, "BoxManagedProcessNotFoundError"},
		{"exited process", "pre", "done", e.token, http.StatusConflict, "BoxManagedProcessConflictError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", strings.Replace(e.url(tc.sid, tc.pid), "ws://", "http://", 1), nil)
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, tc.status, resp.StatusCode)
			var body struct {
				Error struct{ Type, Message string } `json:"error"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			assert.Equal(t, tc.typ, body.Error.Type)
			assert.NotEmpty(t, body.Error.Message)
		})
	}
}

// TestRelayTokenScope: one relay token used to open every session's
// processes, and any holder could take over a live MCP stream. Each
// process's relay_token now opens that process alone: not a sibling, not
// the same process id in another session, not a replacement.
func TestRelayTokenScope(t *testing.T) {
	e := newRelayEnv(t, "bwrap", "")
	e.session(t, "s1")
	e.session(t, "s2")
	e.start(t, "s1", "a", "cat")
	e.start(t, "s1", "b", "cat")
	e.start(t, "s2", "a", "cat")
	tokA := e.relayToken("s1", "a")
	require.NotEqual(t, tokA, e.relayToken("s2", "a"))

	status := func(sid, pid, token string, subprotocol bool) int {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		opts := &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}}
		if subprotocol {
			opts = &websocket.DialOptions{Subprotocols: []string{"mcp", "boxrt.bearer." + base64url(token)}}
		}
		c, resp, err := websocket.Dial(ctx, e.url(sid, pid), opts)
		if err == nil {
			c.Close(websocket.StatusNormalClosure, "")
		}
		require.NotNil(t, resp, "dial %s/%s: %v", sid, pid, err)
		if resp.Body != nil {
			resp.Body.Close()
		}
		return resp.StatusCode
	}
	tests := []struct {
		name, sid, pid, token string
		subprotocol           bool
		want                  int
	}{
		{"own process", "s1", "a", tokA, false, http.StatusSwitchingProtocols},
		{"own process, subprotocol", "s1", "a", tokA, true, http.StatusSwitchingProtocols},
		{"sibling process", "s1", "b", tokA, false, http.StatusUnauthorized},
		{"sibling process, subprotocol", "s1", "b", tokA, true, http.StatusUnauthorized},
		{"same process id in another session", "s2", "a", tokA, false, http.StatusUnauthorized},
		{"default route of another process", "s1", "", tokA, false, http.StatusUnauthorized},
		{"control token still opens any process", "s2", "a", e.token, false, http.StatusSwitchingProtocols},
		{"wrong token", "s1", "a", "x" + tokA, false, http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, status(tc.sid, tc.pid, tc.token, tc.subprotocol))
		})
	}

	t.Run("a replaced process gets a new token; the old one is dead", func(t *testing.T) {
		e.start(t, "s1", "b", "cat")
		tokB := e.relayToken("s1", "b")
		e.start(t, "s1", "b", "cat")
		assert.NotEqual(t, tokB, e.relayToken("s1", "b"))
		assert.Equal(t, http.StatusUnauthorized, status("s1", "b", tokB, false))
		assert.Equal(t, http.StatusSwitchingProtocols, status("s1", "b", e.relayToken("s1", "b"), false))
	})

	t.Run("another process's token cannot take over a live stream", func(t *testing.T) {
		c, _ := e.dial(t, "s1", "a")
		assert.Equal(t, http.StatusUnauthorized, status("s1", "a", e.relayToken("s2", "a"), false))
		writeText(t, c, "still mine")
		assert.Equal(t, "still mine", readText(t, c))
	})
}

func TestRelayFraming(t *testing.T) {
	e := newRelayEnv(t, "bwrap", "")
	e.session(t, "frames")

	t.Run("three messages in one write", func(t *testing.T) {
		e.start(t, "frames", "three", "sh", "-c", `printf '{"a":1}\n{"b":2}\n{"c":3}\n'; sleep 60`)
		c, _ := e.dial(t, "frames", "three")
		assert.Equal(t, []string{`{"a":1}`, `{"b":2}`, `{"c":3}`}, []string{readText(t, c), readText(t, c), readText(t, c)})
	})
	t.Run("1 MiB line is one frame", func(t *testing.T) {
		e.start(t, "frames", "big", "sh", "-c", `head -c 1048576 /dev/zero | tr '\0' x; echo; echo after; sleep 60`)
		c, _ := e.dial(t, "frames", "big")
		assert.Equal(t, strings.Repeat("x", 1<<20), readText(t, c))
		assert.Equal(t, "after", readText(t, c))
	})
	t.Run("10000 messages in order", func(t *testing.T) {
		// Wait for the attach before printing, so the replay bound plays no
		// part: every line must travel live.
		e.start(t, "frames", "many", "sh", "-c", `read -r go; seq 1 10000; sleep 60`)
		c, _ := e.dial(t, "frames", "many")
		writeText(t, c, "go")
		for i := 1; i <= 10000; i++ {
			require.Equal(t, strconv.Itoa(i), readText(t, c))
		}
	})
	t.Run("stdin frames become lines", func(t *testing.T) {
		e.start(t, "frames", "lines", "sh", "-c", `while read -r l; do echo "got:$l"; done`)
		c, _ := e.dial(t, "frames", "lines")
		writeText(t, c, "one")
		writeText(t, c, "two\n")
		assert.Equal(t, "got:one", readText(t, c))
		assert.Equal(t, "got:two", readText(t, c))
	})
	t.Run("process exit closes 1000 with the code", func(t *testing.T) {
		e.start(t, "frames", "exit7", "sh", "-c", `read -r x; echo last; exit 7`)
		c, _ := e.dial(t, "frames", "exit7")
		writeText(t, c, "go")
		assert.Equal(t, "last", readText(t, c))
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		_, _, err := c.Read(ctx)
		var ce websocket.CloseError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, websocket.StatusNormalClosure, ce.Code)
		assert.Contains(t, ce.Reason, "exited with code 7")
	})
}

func TestRelayReplayAndTakeover(t *testing.T) {
	e := newRelayEnv(t, "bwrap", `"relay_replay_lines":100`)
	e.session(t, "replay")
	trigger := filepath.Join(e.ws, "go")

	t.Run("lines printed while detached are replayed", func(t *testing.T) {
		e.start(t, "replay", "later", "sh", "-c", `while [ ! -f /workspace/go ]; do sleep 0.05; done; seq 1 50; sleep 60`)
		c, _ := e.dial(t, "replay", "later")
		c.Close(websocket.StatusNormalClosure, "detaching")
		require.NoError(t, os.WriteFile(trigger, nil, 0o644))
		defer os.Remove(trigger)
		e.waitPending(t, "replay", "later", 50)
		c2, resp := e.dial(t, "replay", "later")
		assert.Equal(t, "50", resp.Header.Get("X-Boxrt-Replay-Lines"))
		assert.Equal(t, "0", resp.Header.Get("X-Boxrt-Replay-Dropped"))
		for i := 1; i <= 50; i++ {
			require.Equal(t, strconv.Itoa(i), readText(t, c2))
		}
	})
	t.Run("overflow drops the oldest and says how many", func(t *testing.T) {
		e.start(t, "replay", "flood", "sh", "-c", `seq 1 500; sleep 60`)
		e.waitPending(t, "replay", "flood", 100)
		time.Sleep(200 * time.Millisecond)
		c, resp := e.dial(t, "replay", "flood")
		assert.Equal(t, "400", resp.Header.Get("X-Boxrt-Replay-Dropped"))
		for i := 401; i <= 500; i++ {
			require.Equal(t, strconv.Itoa(i), readText(t, c))
		}
	})
	t.Run("drop while printing, re-attach, nothing lost", func(t *testing.T) {
		e.start(t, "replay", "ticker", "sh", "-c", `i=1; while [ $i -le 300 ]; do echo $i; i=$((i+1)); sleep 0.005; done; sleep 60`)
		c, _ := e.dial(t, "replay", "ticker")
		last := 0
		for last < 50 {
			last, _ = strconv.Atoi(readText(t, c))
		}
		c.CloseNow()
		time.Sleep(300 * time.Millisecond)
		c2, _ := e.dial(t, "replay", "ticker")
		first, _ := strconv.Atoi(readText(t, c2))
		assert.LessOrEqual(t, first, last+1, "no line after the last one read is lost")
		next := first
		for next < 300 {
			n, _ := strconv.Atoi(readText(t, c2))
			require.Equal(t, next+1, n, "lines arrive in order without gaps")
			next = n
		}
	})
	t.Run("takeover closes the previous socket with 4001", func(t *testing.T) {
		e.start(t, "replay", "shared", "cat")
		a, _ := e.dial(t, "replay", "shared")
		b, _ := e.dial(t, "replay", "shared")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _, err := a.Read(ctx)
		var ce websocket.CloseError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, websocket.StatusCode(4001), ce.Code)
		assert.Contains(t, ce.Reason, "taken over")
		writeText(t, b, "still here")
		assert.Equal(t, "still here", readText(t, b))
	})
}

// TestRelayTooLongLineDroppedOnce: a stdout line over 16 MiB printed while
// nobody was attached used to wedge the relay: its marker went back into
// the replay buffer, so every later attach closed with 1009 and no frames.
// Now the first attach reports it (1009) and the next one continues after
// it.
func TestRelayTooLongLineDroppedOnce(t *testing.T) {
	e := newRelayEnv(t, "bwrap", "")
	e.session(t, "long")
	e.start(t, "long", "p", "sh", "-c", `echo before; head -c 17000000 /dev/zero | tr '\0' x; echo; echo after; sleep 600`)
	e.waitPending(t, "long", "p", 3)

	c, resp := e.dial(t, "long", "p")
	assert.Equal(t, "3", resp.Header.Get("X-Boxrt-Replay-Lines"))
	assert.Equal(t, "before", readText(t, c))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, _, err := c.Read(ctx)
	var ce websocket.CloseError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, websocket.StatusMessageTooBig, ce.Code)
	assert.Contains(t, ce.Reason, "exceeds 16777216 bytes")

	c2, resp := e.dial(t, "long", "p")
	assert.Equal(t, "1", resp.Header.Get("X-Boxrt-Replay-Lines"), "the dropped line's marker is not replayed again")
	assert.Equal(t, "after", readText(t, c2), "the line after the dropped one is delivered")
}

// TestRelayUnfinishedLineBudget: every managed process could hold a 16 MiB
// unfinished stdout line (6 processes reached 228 MiB). One budget now
// bounds them together; a line that would grow past it is dropped and
// reported.
func TestRelayUnfinishedLineBudget(t *testing.T) {
	const budget = 16 << 20
	const procs, lineBytes = 8, 12_000_000 // 96 MB unbounded
	// A low GOGC keeps garbage from passing for held memory.
	e := newRelayEnv(t, "bwrap", fmt.Sprintf(`"relay_line_buffer_bytes":%d`, budget), "GOGC=10")
	e.session(t, "hog")
	for i := range procs {
		e.start(t, "hog", fmt.Sprintf("p%d", i), "sh", "-c",
			fmt.Sprintf(`head -c %d /dev/zero | tr '\0' x; touch /workspace/printed-%d; sleep 600`, lineBytes, i))
	}
	require.Eventually(t, func() bool {
		for i := range procs {
			if _, err := os.Stat(filepath.Join(e.ws, fmt.Sprintf("printed-%d", i))); err != nil {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "every process printed its unfinished line")

	peak := 0.0
	for range 10 {
		v, err := strconv.ParseFloat(metricValue(t, scrape(t, e.p.Addr, e.token), "go_memstats_heap_inuse_bytes"), 64)
		require.NoError(t, err)
		peak = max(peak, v)
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("heap in use: %.1f MiB with a %d MiB budget", peak/(1<<20), budget>>20)
	assert.Less(t, peak, float64(budget+32<<20), "unfinished lines stay within the budget (plus boxrt's own heap)")
	assert.Contains(t, e.p.Stderr(), "stdout line dropped unfinished", "the drop is reported")
}

func TestRelayProcessLifetime(t *testing.T) {
	e := newRelayEnv(t, "bwrap", "")
	t.Run("a running process keeps its session past the TTL", func(t *testing.T) {
		e.session(t, "ttl")
		e.p.MustCall("box_init", map[string]any{"limits": map[string]any{"session_ttl_sec": 1}}, nil)
		defer e.p.MustCall("box_init", map[string]any{"limits": map[string]any{"session_ttl_sec": 300}}, nil)
		e.start(t, "ttl", "keep", "sleep", "600")
		e.p.MustCall("box_create_session", map[string]any{"session_id": "ttl-idle"}, nil)
		require.Eventually(t, func() bool {
			r := e.p.Call("box_get_session", map[string]any{"session_id": "ttl-idle"}, time.Minute)
			return r.Error != nil
		}, 20*time.Second, 200*time.Millisecond, "an idle session is reaped at the short TTL")
		r := e.p.Call("box_get_session", map[string]any{"session_id": "ttl"}, time.Minute)
		require.Nil(t, r.Error, "the session with a running process is spared")
	})
	t.Run("deleting the session kills the process tree", func(t *testing.T) {
		e.session(t, "kill")
		e.start(t, "kill", "tree", "sh", "-c", "sleep 4242 & sleep 4243")
		require.Eventually(t, func() bool { return pgrep("sleep 424") > 0 }, 10*time.Second, 50*time.Millisecond)
		e.p.MustCall("box_delete_session", map[string]any{"session_id": "kill"}, nil)
		assert.Eventually(t, func() bool { return pgrep("sleep 424") == 0 }, 10*time.Second, 50*time.Millisecond)
	})
}

// pgrep counts host processes whose command line contains pattern.
func pgrep(pattern string) int {
	out, _ := exec.Command("pgrep", "-c", "-f", pattern).Output()
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// wsTransport is an MCP client transport over the boxrt relay: one JSON-RPC
// message per text frame.
type wsTransport struct{ c *websocket.Conn }

func (t *wsTransport) Connect(context.Context) (mcp.Connection, error) {
	return &wsConnection{c: t.c}, nil
}

type wsConnection struct {
	c    *websocket.Conn
	once sync.Once
}

func (w *wsConnection) Read(ctx context.Context) (jsonrpc.Message, error) {
	_, data, err := w.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	return jsonrpc.DecodeMessage(data)
}

func (w *wsConnection) Write(ctx context.Context, msg jsonrpc.Message) error {
	data, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	return w.c.Write(ctx, websocket.MessageText, data)
}

func (w *wsConnection) Close() error {
	w.once.Do(func() { w.c.Close(websocket.StatusNormalClosure, "") })
	return nil
}

func (w *wsConnection) SessionID() string { return "" }

// TestMCPEndToEnd runs a real MCP server (official Go SDK) inside the
// sandbox and talks to it with the SDK's client through the relay.
func TestMCPEndToEnd(t *testing.T) {
	eachBackend(t, func(t *testing.T, backend string) {
		e := newRelayEnv(t, backend, "")
		build := exec.Command("go", "build", "-o", filepath.Join(e.ws, "mcpserver"), "./fixtures/mcpserver")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		require.NoError(t, err, "%s", out)
		e.session(t, "mcp")
		var res map[string]any
		e.p.MustCall("box_exec", map[string]any{"session_id": "mcp", "host_path": e.ws,
			"cmd": "echo computed-inside-$(cat /proc/sys/kernel/hostname | wc -c) > /tmp/marker"}, &res)
		require.Equal(t, float64(0), res["exit_code"], "%v", res)
		e.start(t, "mcp", "default", "/workspace/mcpserver")

		c, _ := e.dial(t, "mcp", "") // the legacy route: process "default"
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cs := mcpAdd(ctx, t, c)
		defer cs.Close()
		tools, err := cs.ListTools(ctx, nil)
		require.NoError(t, err)
		var names []string
		for _, tool := range tools.Tools {
			names = append(names, tool.Name)
		}
		assert.ElementsMatch(t, []string{"add", "read_file"}, names)

		read, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "/tmp/marker"}})
		require.NoError(t, err)
		require.False(t, read.IsError, "%v", read.Content)
		var got struct {
			Content string `json:"content"`
			Cwd     string `json:"cwd"`
		}
		require.NoError(t, json.Unmarshal([]byte(mustJSON(t, read.StructuredContent)), &got))
		assert.True(t, strings.HasPrefix(got.Content, "computed-inside-"), got.Content)
		assert.Equal(t, "/workspace", got.Cwd)
		_, err = os.Stat("/tmp/marker")
		assert.True(t, os.IsNotExist(err), "the file exists only inside the sandbox's private /tmp")
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// waitPending waits until the process has n stdout lines waiting for an
// attacher (its replay buffer, as box_get_managed_process reports it).
func (e *relayEnv) waitPending(t *testing.T, session, process string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var got map[string]any
		e.p.MustCall("box_get_managed_process", map[string]any{"session_id": session, "process_id": process}, &got)
		return got["pending_lines"] == float64(n)
	}, 30*time.Second, 50*time.Millisecond, "pending_lines never reached %d", n)
}

// mcpAdd initialises an MCP session with the fixture server over the relay
// socket c and checks its add tool; the caller closes the session.
func mcpAdd(ctx context.Context, t *testing.T, c *websocket.Conn) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "boxrt-test", Version: "1.0.0"}, nil)
	cs, err := client.Connect(ctx, &wsTransport{c: c}, nil)
	require.NoError(t, err, "MCP initialize through the relay")
	sum, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "add", Arguments: map[string]any{"a": 40, "b": 2}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"sum":42}`, mustJSON(t, sum.StructuredContent))
	return cs
}
