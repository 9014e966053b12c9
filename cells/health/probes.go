package health

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/flagcheck"
)

// Config is the health cell's configuration.
type Config struct {
	// HealthAddr is the TCP address of the probe server; empty disables it.
	HealthAddr string
	// ReadinessTimeout is how long a readiness barrier may wait before the
	// health module reports it as an error.
	ReadinessTimeout time.Duration
}

var defaultConfig = Config{HealthAddr: "127.0.0.1:9879", ReadinessTimeout: 5 * time.Minute}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("health-addr", def.HealthAddr,
		"TCP address for the kubelet probes /healthz and /readyz (empty: do not serve); /metrics is on --metrics-addr")
	flags.Duration("readiness-timeout", def.ReadinessTimeout,
		"How long a readiness barrier may stay pending before health reports it as an error naming it (0: never)")
}

// ProbeRoute is a handler served on the health address next to the probes.
type ProbeRoute struct {
	Path    string
	Handler http.Handler
}

// ProbeRoutes is what a constructor returns to serve on the health address.
type ProbeRoutes struct {
	cell.Out

	Routes []ProbeRoute `group:"health-routes,flatten"`
}

type probeParams struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	Lifecycle cell.Lifecycle
	Health    cell.Health
	Readiness *Readiness
	Routes    []ProbeRoute `group:"health-routes"`
}

// probeServer serves /healthz, /readyz and the contributed routes on
// --health-addr.
type probeServer struct {
	addr string
	http *api.HTTPServer
}

func newProbeServer(p probeParams) (*probeServer, error) {
	if p.Config.HealthAddr == "" {
		p.Health.OK("Probe server disabled (--health-addr is empty)")
		return nil, nil
	}
	if err := flagcheck.HostPort(p.Config.HealthAddr); err != nil {
		return nil, fmt.Errorf("invalid --health-addr %q: want host:port, e.g. 127.0.0.1:9879: %w", p.Config.HealthAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /healthz", probeHandler(p.Readiness, func(hz apiv1.Healthz) bool { return hz.Started }))
	mux.Handle("GET /readyz", probeHandler(p.Readiness, func(hz apiv1.Healthz) bool { return hz.Ready }))
	for _, route := range p.Routes {
		mux.Handle("GET "+route.Path, route.Handler)
	}
	s := &probeServer{addr: p.Config.HealthAddr, http: api.NewHTTPServer("probes", mux, p.Log, p.Health)}
	p.Lifecycle.Append(cell.Hook{OnStart: s.start, OnStop: s.stop})
	return s, nil
}

func (s *probeServer) start(cell.HookContext) error {
	return s.http.ServeTCP("health-addr", s.addr)
}

func (s *probeServer) stop(ctx cell.HookContext) error {
	return s.http.Shutdown(ctx)
}

// probeHandler answers 200 when pass holds for the readiness status, else 503.
func probeHandler(r *Readiness, pass func(apiv1.Healthz) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hz, _ := r.Status()
		status := http.StatusOK
		if !pass(hz) {
			status = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(hz)
	})
}
