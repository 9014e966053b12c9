package ctgc

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
)

// gcMetrics are the GC's figures, under cellium_ct_gc_ (the module id).
type gcMetrics struct {
	scanned  *prometheus.CounterVec
	deleted  *prometheus.CounterVec
	passes   *prometheus.CounterVec
	duration prometheus.Histogram
	interval prometheus.Gauge
}

func newGCMetrics() *gcMetrics {
	const ns, sub = "cellium", "ct_gc"
	return &gcMetrics{
		scanned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "entries_scanned_total",
			Help: "Conntrack entries read by garbage collection passes",
		}, []string{"map"}),
		deleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "entries_deleted_total",
			Help: "Conntrack entries deleted, by reason: expired, endpoint_gone (first pass after start), flush, endpoint_deleted (addresses of endpoints deleted)",
		}, []string{"map", "reason"}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "passes_total",
			Help: "Garbage collection passes, by result: ok or error",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "pass_duration_seconds",
			Help:    "Duration of garbage collection passes over every conntrack map",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}),
		interval: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "interval_seconds",
			Help: "Current wait between garbage collection passes",
		}),
	}
}

func gcCollectors(gc *GC) metrics.Collectors {
	m := gc.metrics
	return metrics.NewCollectors(m.scanned, m.deleted, m.passes, m.duration, m.interval)
}

func (m *gcMetrics) observe(p *Pass) {
	for _, mp := range p.Maps {
		m.scanned.WithLabelValues(mp.Map).Add(float64(mp.Scanned))
		m.deleted.WithLabelValues(mp.Map, expired.String()).Add(float64(mp.Expired))
		m.deleted.WithLabelValues(mp.Map, endpointGone.String()).Add(float64(mp.EndpointGone))
	}
	result := "ok"
	if p.Err != nil {
		result = "error"
	}
	m.passes.WithLabelValues(result).Inc()
	m.duration.Observe(p.Duration.Seconds())
	m.interval.Set(p.Interval.Seconds())
}
