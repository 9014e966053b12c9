package monitor

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/pkg/monitorapi"
)

// kindInvalid labels records that could not be decoded.
const kindInvalid = "invalid"

type monitorMetrics struct {
	events         *prometheus.CounterVec
	byKind         map[string]prometheus.Counter
	subscriberDrop *prometheus.CounterVec
	datapathLost   prometheus.CounterFunc
	subscribers    prometheus.GaugeFunc
}

func newMetrics(m *Monitor) *monitorMetrics {
	mm := &monitorMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "monitor", Name: "events_total",
			Help: "Events the monitor received, by type: datapath records (invalid: could not be decoded) and agent notifications",
		}, []string{"type"}),
		subscriberDrop: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "monitor", Name: "subscriber_lost_events_total",
			Help: "Events a subscriber lost because it fell further behind than its buffer",
		}, []string{"subscriber"}),
		subscribers: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "cellium", Subsystem: "monitor", Name: "subscribers",
			Help: "Open subscriptions to the monitor",
		}, func() float64 { return float64(m.hub.Len()) }),
	}
	// The counter lives in a BPF map; a scrape while it cannot be read
	// repeats the last reading, so that the counter never goes down.
	var last atomic.Uint64
	mm.datapathLost = prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "monitor", Name: "datapath_lost_events_total",
		Help: "Events the datapath could not write because the ring buffer was full",
	}, func() float64 {
		if n, err := m.events.LostEvents(); err == nil {
			last.Store(n)
		}
		return float64(last.Load())
	})
	// Resolved once: received is on the path of every event.
	mm.byKind = map[string]prometheus.Counter{}
	for _, kind := range append([]string{kindInvalid}, monitorapi.Kinds...) {
		mm.byKind[kind] = mm.events.WithLabelValues(kind)
	}
	return mm
}

func (mm *monitorMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{mm.events, mm.subscriberDrop, mm.datapathLost, mm.subscribers}
}

func (mm *monitorMetrics) received(kind string) {
	if c, ok := mm.byKind[kind]; ok {
		c.Inc()
		return
	}
	mm.events.WithLabelValues(kind).Inc()
}

// subscriberLost is what a subscription calls for each event it loses.
func (mm *monitorMetrics) subscriberLost(name string) func() {
	return mm.subscriberDrop.WithLabelValues(name).Inc
}
