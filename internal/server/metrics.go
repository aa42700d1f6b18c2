package server

import (
	"net/http"

	"github.com/boxrt/boxrt/relay"
	"github.com/boxrt/boxrt/rpc"
	"github.com/boxrt/boxrt/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics is boxrt's Prometheus registry.
type metrics struct {
	reg *prometheus.Registry
	// known holds each registered method's success counter and duration
	// histogram, looked up once: label hashing on every call shows in the
	// heartbeat's profile.
	known        map[string]methodMetrics
	rpcRequests  *prometheus.CounterVec
	rpcDuration  *prometheus.HistogramVec
	queueWait    prometheus.Histogram
	relayEvents  *prometheus.CounterVec
	relayBytes   *prometheus.CounterVec
	replayDrops  prometheus.Counter
	relayAttachs prometheus.Counter
	execDuration *prometheus.HistogramVec
}

// newMetrics creates the collectors; register adds the runtime's and the
// method names once they exist.
func newMetrics() *metrics {
	m := &metrics{
		reg:   prometheus.NewRegistry(),
		known: map[string]methodMetrics{},
		rpcRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "boxrt_rpc_requests_total", Help: "JSON-RPC requests answered, by method and error type (\"\" on success).",
		}, []string{"method", "error_type"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxrt_rpc_request_duration_seconds", Help: "Time from request to response, by method.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 30, 120},
		}, []string{"method"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "boxrt_rpc_queue_wait_seconds", Help: "Time a request waited in its connection's queue before it ran (0 for most).",
			Buckets: []float64{.0001, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		relayEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "boxrt_relay_frames_total", Help: "Relay frames, by direction (in = to the process's stdin, out = stdout lines).",
		}, []string{"direction"}),
		relayBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "boxrt_relay_bytes_total", Help: "Relay payload bytes, by direction.",
		}, []string{"direction"}),
		replayDrops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "boxrt_relay_replay_dropped_lines_total", Help: "Stdout lines dropped from full replay buffers.",
		}),
		relayAttachs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "boxrt_relay_attaches_total", Help: "Relay attaches.",
		}),
		execDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxrt_exec_duration_seconds", Help: "box_exec duration, by backend and status (completed, timed_out, error).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"backend", "status"}),
	}
	m.reg.MustRegister(m.rpcRequests, m.rpcDuration, m.queueWait, m.relayEvents, m.relayBytes, m.replayDrops, m.relayAttachs,
		m.execDuration, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// logDrops exports the log lines lost to a stuck stderr (see logsink.Sink).
func (m *metrics) logDrops(dropped func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "boxrt_log_dropped_lines_total",
		Help: "Log lines dropped because stderr was not read fast enough (logging never blocks requests).",
	}, func() float64 { return float64(dropped()) }))
}

func (m *metrics) register(rt *runtime.Runtime, methods []string) {
	for _, name := range methods {
		m.known[name] = methodMetrics{ok: m.rpcRequests.WithLabelValues(name, ""), duration: m.rpcDuration.WithLabelValues(name)}
	}
	m.reg.MustRegister(&statusCollector{rt: rt}, &usageCollector{rt: rt}, &egressCollector{rt: rt})
}

func (m *metrics) exec(ev runtime.ExecEvent) {
	status := ev.Status
	if ev.ErrType != "" {
		status = "error"
	}
	m.execDuration.WithLabelValues(ev.Backend, status).Observe(ev.Duration.Seconds())
}

type methodMetrics struct {
	ok       prometheus.Counter
	duration prometheus.Observer
}

func (m *metrics) observe(call rpc.Call) {
	mm, known := m.known[call.Method]
	method := call.Method
	if !known {
		method = "unknown" // bounded label set
		mm.duration = m.rpcDuration.WithLabelValues(method)
	}
	switch {
	case call.Err != nil:
		m.rpcRequests.WithLabelValues(method, call.Err.Type).Inc()
	case known:
		mm.ok.Inc()
	default:
		m.rpcRequests.WithLabelValues(method, "").Inc()
	}
	mm.duration.Observe(call.Duration.Seconds())
	m.queueWait.Observe(call.Waited.Seconds())
}

func (m *metrics) relay(ev relay.Event) {
	switch ev.Kind {
	case "attach":
		m.relayAttachs.Inc()
	case "in", "out":
		m.relayEvents.WithLabelValues(ev.Kind).Add(float64(ev.Count))
		m.relayBytes.WithLabelValues(ev.Kind).Add(float64(ev.Bytes))
	case "replay_dropped":
		m.replayDrops.Add(float64(ev.Count))
	}
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// statusCollector exports the runtime's counters at scrape time.
type statusCollector struct{ rt *runtime.Runtime }

var (
	descSessions  = prometheus.NewDesc("boxrt_sessions_active", "Sessions in the table.", []string{"backend"}, nil)
	descProcesses = prometheus.NewDesc("boxrt_managed_processes_running", "Managed processes running.", nil, nil)
	descSessTotal = prometheus.NewDesc("boxrt_sessions_total", "Session lifecycle events, by event.", []string{"backend", "event"}, nil)
	descExecs     = prometheus.NewDesc("boxrt_execs_total", "Commands run.", nil, nil)
	descTimeouts  = prometheus.NewDesc("boxrt_exec_timeouts_total", "Commands killed at their timeout.", nil, nil)
	descTruncated = prometheus.NewDesc("boxrt_exec_truncated_outputs_total", "Execs whose stdout or stderr exceeded the cap.", nil, nil)
	descProcTotal = prometheus.NewDesc("boxrt_managed_processes_total", "Managed-process events, by event (started, exited, replaced).", []string{"event"}, nil)
	descHealth    = prometheus.NewDesc("boxrt_backend_available", "1 when the selected backend answered its last probe.", []string{"backend"}, nil)
	descProbe     = prometheus.NewDesc("boxrt_backend_probe_seconds", "Latency of the last backend probe.", []string{"backend"}, nil)
	descProbeFail = prometheus.NewDesc("boxrt_backend_probe_failures_total", "Failed backend probes.", nil, nil)
)

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessions, descProcesses, descSessTotal, descExecs, descTimeouts, descTruncated, descProcTotal, descHealth, descProbe, descProbeFail} {
		ch <- d
	}
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.rt.Status()
	backend := ""
	if st.Backend.Name != nil {
		backend = *st.Backend.Name
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(descSessions, float64(st.ActiveSessions), backend)
	gauge(descProcesses, float64(st.ManagedProcesses))
	counter(descSessTotal, st.TotalCreated, backend, "created")
	counter(descSessTotal, st.TotalReused, backend, "reused")
	counter(descSessTotal, st.TotalReaped, backend, "reaped")
	counter(descSessTotal, st.TotalRecreated, backend, "recreated")
	counter(descSessTotal, st.TotalCleaned, backend, "destroyed")
	counter(descExecs, st.TotalExecs)
	counter(descTimeouts, st.TotalTimeouts)
	counter(descTruncated, st.TotalTruncated)
	counter(descProcTotal, st.ProcessesStarted, "started")
	counter(descProcTotal, st.ProcessesExited, "exited")
	counter(descProcTotal, st.ProcessesReplaced, "replaced")
	available := 0.0
	if st.Backend.Available {
		available = 1
	}
	gauge(descHealth, available, backend)
	gauge(descProbe, st.Backend.ProbeMS/1000, backend)
	counter(descProbeFail, st.HealthCheckFailures)
}
