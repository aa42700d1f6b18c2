package test

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type sessionMetrics struct {
	SessionID       string  `json:"session_id"`
	Backend         string  `json:"backend"`
	State           string  `json:"state"`
	At              string  `json:"at"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	MemoryBytes     int64   `json:"memory_bytes"`
	MemoryPeakBytes int64   `json:"memory_peak_bytes"`
	DiskUsedBytes   int64   `json:"disk_used_bytes"`
	DiskQuotaBytes  int64   `json:"disk_quota_bytes"`
	NetRxBytes      int64   `json:"net_rx_bytes"`
	NetTxBytes      int64   `json:"net_tx_bytes"`
	Processes       int     `json:"processes"`
	OOMKills        int64   `json:"oom_kills"`
}

func TestSessionMetrics(t *testing.T) {
	for _, backend := range []string{"bwrap", "docker"} {
		t.Run(backend, func(t *testing.T) {
			p := Start(t, Options{Stdio: true, Config: "{" + portBackends[backend] + "}"})
			const sid = "m"
			p.MustCall("box_create_session", map[string]any{"session_id": sid}, nil)
			t.Cleanup(func() { p.Call("box_delete_session", map[string]any{"session_id": sid}, time.Minute) })
			run := func(cmd string) {
				var res struct {
					ExitCode *int   `json:"exit_code"`
					Stderr   string `json:"stderr"`
				}
				p.MustCall("box_exec", map[string]any{"session_id": sid, "cmd": cmd, "timeout_sec": 60}, &res)
				require.NotNil(t, res.ExitCode)
				require.Equal(t, 0, *res.ExitCode, "%s: %s", cmd, res.Stderr)
			}
			metrics := func() sessionMetrics {
				var m sessionMetrics
				p.MustCall("box_get_session_metrics", map[string]any{"session_id": sid}, &m)
				return m
			}
			run("sleep 300 >/dev/null 2>&1 &")
			before := metrics()
			assert.Equal(t, sid, before.SessionID)
			assert.Equal(t, backend, before.Backend)
			assert.Equal(t, "running", before.State)
			assert.Positive(t, before.MemoryBytes)
			assert.Positive(t, before.CPUSeconds)
			assert.GreaterOrEqual(t, before.Processes, 1, "the sleep")
			assert.Zero(t, before.NetRxBytes+before.NetTxBytes, "network off: no interface but lo")

			run(`python3 -c "b = b'x' * (100 << 20); print(len(b))"`)
			run("head -c 52428800 /dev/urandom > /workspace/fill && sync")
			after := metrics()
			assert.GreaterOrEqual(t, after.MemoryPeakBytes-before.MemoryPeakBytes, int64(90<<20), "peak memory after allocating 100 MiB: %+v then %+v", before, after)
			assert.GreaterOrEqual(t, after.DiskUsedBytes-before.DiskUsedBytes, int64(45<<20), "disk after writing 50 MiB: %+v then %+v", before, after)
			assert.Greater(t, after.CPUSeconds, before.CPUSeconds)

			r := p.Call("box_get_session_metrics", map[string]any{"session_id": "nope"}, time.Minute)
			require.NotNil(t, r.Error)
			assert.Equal(t, "BoxSessionNotFoundError", r.Error.Type())
		})
	}
}

// TestSessionUsageSeries: metrics.session_usage adds each session's usage
// to /metrics; without it no per-session series exist.
func TestSessionUsageSeries(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("session_usage=", on), func(t *testing.T) {
			p := Start(t, Options{Stdio: true, Args: []string{"--metrics-public"},
				Config: fmt.Sprintf(`{"backend":"bwrap","metrics":{"session_usage":%v}}`, on)})
			p.MustCall("box_create_session", map[string]any{"session_id": "u"}, nil)
			t.Cleanup(func() { p.Call("box_delete_session", map[string]any{"session_id": "u"}, time.Minute) })
			p.MustCall("box_exec", map[string]any{"session_id": "u", "cmd": "true"}, nil)
			resp, err := http.Get("http://" + p.Addr + "/metrics")
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.NoError(t, err)
			assert.Contains(t, string(body), `boxrt_webhook_events_total{outcome="dropped"} 0`)
			series := `boxrt_session_memory_bytes{backend="bwrap",session="u"}`
			if on {
				assert.Contains(t, string(body), series)
				assert.Contains(t, string(body), `boxrt_session_cpu_seconds_total{backend="bwrap",session="u"}`)
			} else {
				assert.NotContains(t, string(body), "boxrt_session_memory_bytes")
			}
		})
	}
}
