package e2bapi

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/boxrt/boxrt/runtime"
	"github.com/boxrt/boxrt/runtime/tenant"
)

// metricJSON is E2B's SandboxMetric: one sample, taken when asked (boxrt
// keeps no history, so a time range gets the current sample). Bytes are
// bytes; cpuUsedPct is the share of the sandbox's CPUs used on average
// since it started.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// maxMetricsIDs bounds the sandbox ids one GET /sandboxes/metrics names.
const maxMetricsIDs = 100

// metrics is GET /sandboxes/{id}/metrics: an array of one sample.
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) {
	h.withSandbox(w, r, func(_ *sandbox, info runtime.SessionInfo) {
		m, err := h.sample(r.Context(), info)
		if err != nil {
			writeRuntimeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, []metricJSON{m})
	})
}

// metricsOf is GET /sandboxes/metrics?sandbox_ids=a,b: the latest sample
// of each named sandbox of the caller's that exists.
func (h *Handler) metricsOf(w http.ResponseWriter, r *http.Request) {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, "at most 100 sandbox_ids")
		return
	}
	out := map[string]metricJSON{}
	for _, id := range ids {
		if id = strings.TrimSpace(id); id == "" {
			continue
		}
		details, err := h.rt.GetSession(r.Context(), id)
		if err != nil {
			continue
		}
		if m, err := h.sample(r.Context(), details.SessionInfo); err == nil {
			out[id] = m
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// sample measures a session (box_get_session_metrics) in E2B's terms.
func (h *Handler) sample(ctx context.Context, info runtime.SessionInfo) (metricJSON, error) {
	u, err := h.rt.SessionMetrics(ctx, tenant.Logical(ctx, info.SessionID))
	if err != nil {
		return metricJSON{}, err
	}
	cpus := max(1, int(info.CPUs+0.999))
	m := metricJSON{Timestamp: u.At, TimestampUnix: u.At.Unix(), CPUCount: cpus, MemUsed: u.MemoryBytes,
		MemTotal: u.MemoryLimitBytes, DiskUsed: u.DiskUsedBytes, DiskTotal: u.DiskQuotaBytes}
	if m.MemTotal == 0 {
		m.MemTotal = int64(info.MemoryMB) << 20
	}
	if up := u.At.Sub(info.CreatedAt).Seconds(); up > 0 {
		m.CPUUsedPct = min(100, 100*u.CPUSeconds/up/float64(cpus))
	}
	return m, nil
}
