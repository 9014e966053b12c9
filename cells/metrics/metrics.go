// Package metrics is the agent's Prometheus registry, served at /metrics on
// the health address.
//
// Cells contribute collectors through the "metrics" value group:
//
//	func newMyMetrics() (*myMetrics, metrics.Collectors) {
//		m := &myMetrics{entries: prometheus.NewGauge(...)}
//		return m, metrics.NewCollectors(m.entries)
//	}
//
// A collector's constructor must not depend on the registry (the registry
// depends on every collector). The cell also implements the metric hooks of
// the libraries: hive start/stop durations (hive.Metrics), per-reconciler
// durations and errors (reconciler.Metrics) and per-table StateDB figures
// (statedb.Metrics). All names start with "cellium_".
package metrics

import (
	"fmt"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cellium/cellium/cells/health"
)

// Cell provides the registry and the library metric hooks.
var Cell = cell.Module(
	"metrics",
	"Prometheus metrics registry",

	cell.Config(defaultConfig),
	cell.Provide(
		newRegistry,
		newHiveMetrics,
		newReconcilerMetrics,
		newStateDBMetrics,
		probeRoute,
		pprofRoute,
	),
)

// namespace prefixes every metric the agent exports.
const namespace = "cellium"

// Collectors is what a constructor returns to contribute collectors.
type Collectors struct {
	cell.Out

	Collectors []prometheus.Collector `group:"metrics,flatten"`
}

// NewCollectors wraps collectors for returning from a constructor.
func NewCollectors(cs ...prometheus.Collector) Collectors { return Collectors{Collectors: cs} }

type registryParams struct {
	cell.In

	Collectors []prometheus.Collector `group:"metrics"`
}

func newRegistry(p registryParams) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	all := append([]prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, p.Collectors...)
	for _, c := range all {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics collector %T: %w", c, err)
		}
	}
	return reg, nil
}

func probeRoute(reg *prometheus.Registry) health.ProbeRoutes {
	return health.ProbeRoutes{Routes: []health.ProbeRoute{{
		Path:    "/metrics",
		Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}}}
}
