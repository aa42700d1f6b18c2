package server

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/boxrt/boxrt/runtime"
)

// usageCollector exports the events' drops and the webhook's deliveries,
// and, when metrics.session_usage is on, each session's usage (bounded:
// runtime.MaxUsageSeries sessions), all measured at scrape time.
type usageCollector struct{ rt *runtime.Runtime }

// usageScrapeTimeout bounds what measuring the sessions adds to a scrape.
const usageScrapeTimeout = 5 * time.Second

var (
	descEventDrops = prometheus.NewDesc("boxrt_session_events_dropped_total", "Session events a subscriber's full queue lost.", nil, nil)
	descWebhook    = prometheus.NewDesc("boxrt_webhook_events_total", "Webhook events, by outcome (delivered, failed, dropped).", []string{"outcome"}, nil)
	usageLabels    = []string{"session", "backend"}
	descUsage      = map[string]*prometheus.Desc{
		"cpu":       prometheus.NewDesc("boxrt_session_cpu_seconds_total", "CPU time a session's sandbox used.", usageLabels, nil),
		"memory":    prometheus.NewDesc("boxrt_session_memory_bytes", "A session's memory in use.", usageLabels, nil),
		"peak":      prometheus.NewDesc("boxrt_session_memory_peak_bytes", "A session's highest memory use.", usageLabels, nil),
		"disk":      prometheus.NewDesc("boxrt_session_disk_used_bytes", "What a session's disk holds.", usageLabels, nil),
		"rx":        prometheus.NewDesc("boxrt_session_network_receive_bytes_total", "Bytes a session received (interfaces other than lo).", usageLabels, nil),
		"tx":        prometheus.NewDesc("boxrt_session_network_transmit_bytes_total", "Bytes a session sent (interfaces other than lo).", usageLabels, nil),
		"processes": prometheus.NewDesc("boxrt_session_processes", "Processes running in a session.", usageLabels, nil),
	}
)

func (c *usageCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descEventDrops
	ch <- descWebhook
	for _, d := range descUsage {
		ch <- d
	}
}

func (c *usageCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.rt.Status().Events
	ch <- prometheus.MustNewConstMetric(descEventDrops, prometheus.CounterValue, float64(st.Dropped))
	for outcome, n := range map[string]int64{"delivered": st.Webhook.Delivered, "failed": st.Webhook.Failed, "dropped": st.Webhook.Dropped} {
		ch <- prometheus.MustNewConstMetric(descWebhook, prometheus.CounterValue, float64(n), outcome)
	}
	if !c.rt.Config().Metrics.SessionUsage {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), usageScrapeTimeout)
	defer cancel()
	for _, m := range c.rt.Internal().Usage(ctx, runtime.MaxUsageSeries) {
		put := func(key string, typ prometheus.ValueType, v float64) {
			ch <- prometheus.MustNewConstMetric(descUsage[key], typ, v, m.SessionID, m.Backend)
		}
		put("cpu", prometheus.CounterValue, m.CPUSeconds)
		put("memory", prometheus.GaugeValue, float64(m.MemoryBytes))
		put("peak", prometheus.GaugeValue, float64(m.MemoryPeakBytes))
		put("disk", prometheus.GaugeValue, float64(m.DiskUsedBytes))
		put("rx", prometheus.CounterValue, float64(m.NetRxBytes))
		put("tx", prometheus.CounterValue, float64(m.NetTxBytes))
		put("processes", prometheus.GaugeValue, float64(m.Processes))
	}
}
