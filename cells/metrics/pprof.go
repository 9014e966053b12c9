package metrics

import (
	"net/http"
	"net/http/pprof"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/pkg/heapprofile"
)

// pprofRoute serves the profiles when --pprof is set, on --health-addr: a
// debugging aid stays on the probes' loopback address, away from the
// metrics address that a scraper elsewhere reaches. The heap profile is
// sampled only then, from the graph's construction on: the agent's binary
// starts with the profiler off (pkg/heapprofile/off).
func pprofRoute(cfg Config) health.ProbeRoutes {
	if !cfg.Pprof {
		return health.ProbeRoutes{}
	}
	heapprofile.Sample()
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return health.ProbeRoutes{Routes: []health.ProbeRoute{{Path: "/debug/pprof/", Handler: mux}}}
}
