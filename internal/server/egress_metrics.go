package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/boxrt/boxrt/runtime"
)

// egressCollector exports the egress proxy's totals. Its labels are fixed
// (decision, direction): names and addresses stay in box_get_session, so
// a sandbox inventing names cannot grow the metrics.
type egressCollector struct{ rt *runtime.Runtime }

var (
	descEgressConns    = prometheus.NewDesc("boxrt_egress_connections_total", "Connections and DNS questions from sandboxes, by the egress proxy's decision (allowed, denied).", []string{"decision"}, nil)
	descEgressBytes    = prometheus.NewDesc("boxrt_egress_bytes_total", "Bytes through the egress proxy, by direction (out = from sandboxes).", []string{"direction"}, nil)
	descEgressOpen     = prometheus.NewDesc("boxrt_egress_connections_open", "Connections the egress proxy holds now.", nil, nil)
	descEgressSessions = prometheus.NewDesc("boxrt_egress_sessions_attached", "Sandbox network namespaces the egress proxy serves now.", nil, nil)
)

func (c *egressCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEgressConns, descEgressBytes, descEgressOpen, descEgressSessions} {
		ch <- d
	}
}

func (c *egressCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.rt.EgressTotals()
	ch <- prometheus.MustNewConstMetric(descEgressConns, prometheus.CounterValue, float64(t.Allowed), "allowed")
	ch <- prometheus.MustNewConstMetric(descEgressConns, prometheus.CounterValue, float64(t.Denied), "denied")
	ch <- prometheus.MustNewConstMetric(descEgressBytes, prometheus.CounterValue, float64(t.BytesOut), "out")
	ch <- prometheus.MustNewConstMetric(descEgressBytes, prometheus.CounterValue, float64(t.BytesIn), "in")
	ch <- prometheus.MustNewConstMetric(descEgressOpen, prometheus.GaugeValue, float64(t.Conns))
	ch <- prometheus.MustNewConstMetric(descEgressSessions, prometheus.GaugeValue, float64(t.Sessions))
}
