// Package metrics is the agent's Prometheus registry, served at /metrics on
// --metrics-addr (127.0.0.1:9962 by default), an address of its own so that
// a scraper on another machine may reach it while the kubelet probes on
// --health-addr stay on loopback.
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
	"log/slog"
	"net/http"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/flagcheck"
)

// Cell provides the registry and the library metric hooks, and serves the
// registry on --metrics-addr.
var Cell = cell.Module(
	"metrics",
	"Prometheus metrics registry",

	cell.Config(defaultConfig),
	cell.Provide(
		newRegistry,
		newHiveMetrics,
		newReconcilerMetrics,
		newStateDBMetrics,
		pprofRoute,
	),
	cell.ProvidePrivate(newServer),
	cell.Invoke(func(*server) {}),
)

// Config is the metrics cell's configuration.
type Config struct {
	// MetricsAddr is the TCP address of /metrics; empty turns it off.
	MetricsAddr string
	// Pprof serves the Go runtime's profiles at /debug/pprof/ on the health
	// address. Off by default: a debugging aid, not an interface.
	Pprof bool
}

var defaultConfig = Config{MetricsAddr: "127.0.0.1:9962", Pprof: false}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("metrics-addr", def.MetricsAddr,
		"TCP address for /metrics (empty: do not serve); \":9962\" serves it on every address of the node")
	flags.Bool("pprof", def.Pprof,
		"Serve Go runtime profiles (heap, CPU, goroutines) at /debug/pprof/ on --health-addr; for debugging only")
}

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

// server serves /metrics on --metrics-addr.
type server struct {
	addr string
	http *api.HTTPServer
}

func newServer(cfg Config, reg *prometheus.Registry, lc cell.Lifecycle, log *slog.Logger, health cell.Health) (*server, error) {
	if cfg.MetricsAddr == "" {
		health.OK("Metrics server disabled (--metrics-addr is empty)")
		return nil, nil
	}
	if err := flagcheck.HostPort(cfg.MetricsAddr); err != nil {
		return nil, fmt.Errorf("invalid --metrics-addr %q: want host:port, e.g. 127.0.0.1:9962: %w", cfg.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s := &server{addr: cfg.MetricsAddr, http: api.NewHTTPServer("metrics", mux, log, health)}
	lc.Append(cell.Hook{
		OnStart: func(cell.HookContext) error { return s.http.ServeTCP("metrics-addr", s.addr) },
		OnStop:  func(ctx cell.HookContext) error { return s.http.Shutdown(ctx) },
	})
	return s, nil
}
