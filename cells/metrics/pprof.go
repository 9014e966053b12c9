package metrics

import (
	"net/http"
	"net/http/pprof"

	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/health"
)

// Config is the metrics cell's configuration.
type Config struct {
	// Pprof serves the Go runtime's profiles at /debug/pprof/ on the health
	// address. Off by default: a debugging aid, not an interface.
	Pprof bool
}

var defaultConfig = Config{Pprof: false}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("pprof", def.Pprof,
		"Serve Go runtime profiles (heap, CPU, goroutines) at /debug/pprof/ on --health-addr; for debugging only")
}

// pprofRoute serves the profiles when --pprof is set.
func pprofRoute(cfg Config) health.ProbeRoutes {
	if !cfg.Pprof {
		return health.ProbeRoutes{}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return health.ProbeRoutes{Routes: []health.ProbeRoute{{Path: "/debug/pprof/", Handler: mux}}}
}
