package ctgc

import (
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"
)

// Cell collects garbage from the conntrack maps and serves them over the
// API: see the package documentation.
var Cell = cell.Module(
	"ct-gc",
	"Conntrack garbage collection with an adaptive interval",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newGC, gcCollectors, apiRoutes),
	cell.Invoke(requireGC),
)

// requireGC pulls the GC into the graph: nothing needs to depend on it for
// it to run.
func requireGC(*GC) {}

// Config is the ct-gc cell's configuration.
type Config struct {
	// ConntrackGCInterval, when not zero, is the wait between passes,
	// which then no longer adapts.
	ConntrackGCInterval    time.Duration
	ConntrackGCIntervalMin time.Duration
	ConntrackGCIntervalMax time.Duration
}

var defaultConfig = Config{
	ConntrackGCIntervalMin: 10 * time.Second,
	ConntrackGCIntervalMax: 12 * time.Hour,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Duration("conntrack-gc-interval", def.ConntrackGCInterval,
		"Wait between conntrack garbage collection passes; 0: adapt it to how much each pass deletes")
	flags.Duration("conntrack-gc-interval-min", def.ConntrackGCIntervalMin,
		"Shortest wait between conntrack garbage collection passes when the interval adapts")
	flags.Duration("conntrack-gc-interval-max", def.ConntrackGCIntervalMax,
		"Longest wait between conntrack garbage collection passes when the interval adapts")
}
