package test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scrape returns the /metrics text.
func scrape(t *testing.T, addr, token string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// metricValue finds one sample line "name{labels} value".
func metricValue(t *testing.T, text, series string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Errorf("series %s not found", series)
	return ""
}

func TestMetricsExactCounts(t *testing.T) {
	e := newRelayEnv(t, "bwrap", "")
	p := e.p

	// /metrics is token-protected like everything but the health checks.
	resp, err := http.Get("http://" + p.Addr + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	for range 3 {
		p.MustCall("__ping", map[string]any{}, nil)
	}
	execIn(t, p, map[string]any{"session_id": "m", "host_path": e.ws, "cmd": "true"})
	execIn(t, p, map[string]any{"session_id": "m", "host_path": e.ws, "cmd": "head -c 2000 /dev/zero", "max_output_bytes": 1024})
	r := execIn(t, p, map[string]any{"session_id": "m", "host_path": e.ws, "cmd": "sleep 5", "timeout_sec": 1})
	require.Equal(t, "timed_out", r.Status)
	require.NotNil(t, p.Call("box_exec", map[string]any{"session_id": "m", "cmd": "true", "timeout_sec": 0}, time.Minute).Error)
	require.NotNil(t, p.Call("box_nope", map[string]any{}, time.Minute).Error)

	e.start(t, "m", "cat", "cat")
	c, _ := e.dial(t, "m", "cat")
	for _, msg := range []string{"one", "two"} {
		writeText(t, c, msg)
		assert.Equal(t, msg, readText(t, c))
	}
	c.Close(websocket.StatusNormalClosure, "")

	text := scrape(t, p.Addr, e.token)
	want := map[string]string{
		`boxrt_rpc_requests_total{error_type="",method="__ping"}`:                     "3",
		`boxrt_rpc_requests_total{error_type="",method="box_exec"}`:                   "3",
		`boxrt_rpc_requests_total{error_type="BoxValidationError",method="box_exec"}`: "1",
		`boxrt_rpc_requests_total{error_type="MethodNotFound",method="unknown"}`:      "1",
		`boxrt_execs_total`:                  "3",
		`boxrt_exec_timeouts_total`:          "1",
		`boxrt_exec_truncated_outputs_total`: "1",
		`boxrt_exec_duration_seconds_count{backend="bwrap",status="completed"}`: "2",
		`boxrt_exec_duration_seconds_count{backend="bwrap",status="timed_out"}`: "1",
		`boxrt_sessions_total{backend="bwrap",event="created"}`:                 "1",
		`boxrt_sessions_total{backend="bwrap",event="reused"}`:                  "2",
		`boxrt_sessions_active{backend="bwrap"}`:                                "1",
		`boxrt_managed_processes_running`:                                       "1",
		`boxrt_managed_processes_total{event="started"}`:                        "1",
		`boxrt_relay_attaches_total`:                                            "1",
		`boxrt_relay_frames_total{direction="in"}`:                              "2",
		`boxrt_relay_frames_total{direction="out"}`:                             "2",
		`boxrt_relay_bytes_total{direction="in"}`:                               "8",
		`boxrt_relay_bytes_total{direction="out"}`:                              "6",
		`boxrt_backend_available{backend="bwrap"}`:                              "1",
	}
	for series, v := range want {
		assert.Equal(t, v, metricValue(t, text, series), series)
	}
	assert.Contains(t, text, "go_goroutines ")

	var st map[string]any
	p.MustCall("box_status", map[string]any{}, &st)
	assert.Equal(t, float64(1), st["total_created"])
	assert.Equal(t, float64(2), st["total_reused"])
	recent, _ := st["recent_errors"].([]any)
	require.Len(t, recent, 2, "the validation error and the unknown method")
	newest := recent[0].(map[string]any)
	assert.Equal(t, "box_nope", newest["method"])
	assert.Equal(t, "MethodNotFound", newest["type"])
	older := recent[1].(map[string]any)
	assert.Equal(t, "BoxValidationError", older["type"])
	assert.Equal(t, "m", older["session_id"])
}

// TestHeartbeatAllocations: boxrt as shipped — tenancy, the method table,
// the log-level check and the metrics around the frame loop — answers
// __ping without allocating per call (the frame loop's own zero is
// rpc's TestInlineCallAllocatesNothing), so a host that only heartbeats
// does not keep boxrt's garbage collector going. Counted from boxrt's own
// go_memstats_mallocs_total (a scrape's own allocations taken off), not
// timed.
func TestHeartbeatAllocations(t *testing.T) {
	// At the default log level: at debug every call is a log line.
	p := Start(t, Options{Stdio: true, Args: []string{"--log-level", "info", "--metrics-public"}})
	mallocs := func() float64 {
		v, err := strconv.ParseFloat(metricValue(t, scrape(t, p.Addr, ""), "go_memstats_mallocs_total"), 64)
		require.NoError(t, err)
		return v
	}
	ping := func(n int) {
		for range n {
			p.MustCall("__ping", map[string]any{}, nil)
		}
	}
	ping(200)
	// A scrape's own allocations vary by a few hundred: take the larger of
	// two.
	first, second, third := mallocs(), mallocs(), mallocs()
	scrapeCost := max(second-first, third-second)
	const pings = 20000
	ping(pings)
	extra := mallocs() - third - scrapeCost
	t.Logf("a scrape: %.0f allocations; %d pings: %.0f more (%.3f per ping)", scrapeCost, pings, extra, extra/pings)
	// Before the heartbeat path stopped allocating it was 6 per ping. The
	// boxrt under test is a race build, whose sync.Pool drops a quarter of
	// what is put back: json.Valid, which checks the request's "params":{}
	// with a pooled scanner, then allocates a scanner and its parse stack
	// about every fourth call (~0.5 per ping; a plain build measured ~0.03,
	// background work included).
	assert.Less(t, extra/pings, 1.0)
}

func TestFailingExecLogs(t *testing.T) {
	p := backendProc(t, "bwrap", "")
	p.MustCall("box_create_session", map[string]any{"session_id": "logs", "network": "on"}, nil)
	r := p.Call("box_exec", map[string]any{"session_id": "logs", "cmd": "echo " + strings.Repeat("x", 500),
		"env": map[string]string{"API_KEY": "supersecret-value"}}, time.Minute)
	require.NotNil(t, r.Error)
	p.Stop()

	var execLine, rpcLine map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.Stderr()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			t.Errorf("log line is not JSON: %s", sc.Text())
			continue
		}
		if m["message"] == "exec" && m["session_id"] == "logs" {
			execLine = m
		}
		if m["message"] == "rpc" && m["method"] == "box_exec" {
			rpcLine = m
		}
	}
	require.NotNil(t, execLine, "an exec log line")
	assert.Equal(t, "BoxSessionConflictError", execLine["error_type"])
	assert.Equal(t, []any{"API_KEY"}, execLine["env_keys"])
	assert.Contains(t, execLine, "duration_ms")
	assert.LessOrEqual(t, len(execLine["cmd"].(string)), 210, "the command is cut to a preview")
	require.NotNil(t, rpcLine, "an rpc log line")
	for _, f := range []string{"request_id", "duration_ms", "error_type", "transport"} {
		assert.Contains(t, rpcLine, f)
	}
	assert.Equal(t, "logs", rpcLine["session_id"])
	assert.NotContains(t, p.Stderr(), "supersecret-value", "env values are never logged")
}

func TestDoctor(t *testing.T) {
	out, err := exec.Command(binPath, "doctor", "--json", "--state-dir", t.TempDir()).Output()
	require.NoError(t, err, "doctor exits 0 when a backend works: %s", out)
	var rep struct {
		Checks []struct{ Backend, Status, What, Fix string } `json:"checks"`
		Usable []string                                      `json:"usable_backends"`
		Auto   string                                        `json:"auto_selects"`
		// Measured in a probe sandbox per backend and engine runtime.
		Isolation []struct {
			Backend, Runtime, Error string
			KernelShared            bool `json:"kernel_shared"`
			Capabilities            int
			ReadOnlyRoot            bool     `json:"read_only_root"`
			NetworkInterfaces       []string `json:"network_interfaces"`
		} `json:"isolation"`
	}
	require.NoError(t, json.Unmarshal(out, &rep))
	// CI installs and starts both, and registers runsc with dockerd.
	assert.ElementsMatch(t, []string{"docker", "bwrap"}, rep.Usable)
	assert.Equal(t, "docker", rep.Auto)
	measured := map[string]bool{}
	for _, iso := range rep.Isolation {
		name := iso.Backend + "/" + iso.Runtime
		measured[name] = iso.KernelShared
		assert.Empty(t, iso.Error, name)
		assert.Zero(t, iso.Capabilities, name)
		assert.True(t, iso.ReadOnlyRoot, name)
		assert.Empty(t, iso.NetworkInterfaces, name)
	}
	assert.Equal(t, map[string]bool{"docker/runc": true, "docker/runsc": false, "bwrap/": true}, measured,
		"runc and bwrap share the host kernel, gVisor does not")
	for _, ch := range rep.Checks {
		if ch.Status != "ok" {
			assert.NotEmpty(t, ch.Fix, "a problem always comes with a fix: %s", ch.What)
		}
	}
	human, err := exec.Command(binPath, "doctor", "--state-dir", t.TempDir()).Output()
	require.NoError(t, err)
	assert.Contains(t, string(human), `backend="auto" selects: docker`)

	broken := exec.Command(binPath, "doctor", "--state-dir", t.TempDir())
	broken.Env = []string{"PATH=/nonexistent", "DOCKER_HOST=unix:///nonexistent.sock"}
	out, err = broken.Output()
	require.Error(t, err, "no backend → exit 1")
	assert.Contains(t, string(out), "apt-get install bubblewrap")
	assert.Contains(t, string(out), "no engine socket")
}
