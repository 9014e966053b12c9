package lbmaps

import (
	"fmt"
	"strings"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/maglev"
)

// Cell declares the load-balancing maps and provides them as *Maps.
var Cell = cell.Module(
	"lb-maps",
	"BPF maps of socket load balancing",

	cell.Config(defaultConfig),
	cell.Provide(newMaps, newReconciler, opsMetrics, frontendsReconciled, programmed),
	cell.ProvidePrivate(newOps, job.Registry.NewGroup),
	cell.Invoke(requireReconciler),
)

// requireReconciler pulls the maps and their reconciler into the graph:
// nothing else needs them, but the datapath does.
func requireReconciler(*Maps, Reconciler) {}

// programmed tells the loadbalancer writer which frontends the maps hold
// already (ops.Holds).
func programmed(o *ops) loadbalancer.Programmed { return o }

// Backend selection algorithms, the values of --lb-algorithm.
const (
	AlgorithmRandom = "random"
	AlgorithmMaglev = "maglev"
)

// Config is the lb-maps cell's configuration.
type Config struct {
	LBServiceMapMax    uint32
	LBBackendMapMax    uint32
	LBRevnatMapMax     uint32
	LBAffinityMapMax   uint32
	LBSockRevnatMapMax uint32
	LBMaglevTableSize  uint32
	LBAlgorithm        string
}

var defaultConfig = Config{
	LBServiceMapMax:    65536,
	LBBackendMapMax:    65536,
	LBRevnatMapMax:     65536,
	LBAffinityMapMax:   65536,
	LBSockRevnatMapMax: 262144,
	LBMaglevTableSize:  maglev.DefaultSize,
	LBAlgorithm:        AlgorithmRandom,
}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint32("lb-service-map-max", def.LBServiceMapMax,
		"Entries of each service map: a frontend takes one plus one per backend")
	flags.Uint32("lb-backend-map-max", def.LBBackendMapMax, "Entries of each backend map")
	flags.Uint32("lb-revnat-map-max", def.LBRevnatMapMax,
		"Entries of each reverse NAT map, and of each Maglev map: one per frontend, at most 65536")
	flags.Uint32("lb-affinity-map-max", def.LBAffinityMapMax,
		"Entries of the session affinity map (LRU): one per client network namespace and frontend")
	flags.Uint32("lb-sock-revnat-map-max", def.LBSockRevnatMapMax,
		"Entries of each socket reverse NAT map (LRU): one per socket and backend it was sent to")
	flags.Uint32("lb-maglev-table-size", def.LBMaglevTableSize,
		"Slots of each Maglev table, a prime: "+joinInts(maglev.Sizes())+"; above 100 times the backends of any service")
	flags.String("lb-algorithm", def.LBAlgorithm,
		"How a socket picks a backend: random (a random slot) or maglev (the service's Maglev table)")
}

func (cfg Config) validate() error {
	for _, f := range []struct {
		flag string
		max  uint32
	}{
		{"lb-service-map-max", cfg.LBServiceMapMax},
		{"lb-backend-map-max", cfg.LBBackendMapMax},
		{"lb-revnat-map-max", cfg.LBRevnatMapMax},
		{"lb-affinity-map-max", cfg.LBAffinityMapMax},
		{"lb-sock-revnat-map-max", cfg.LBSockRevnatMapMax},
	} {
		if f.max == 0 {
			return fmt.Errorf("invalid --%s 0: want at least 1 entry", f.flag)
		}
	}
	// The reverse NAT index is 16 bits: more entries could never be used.
	if cfg.LBRevnatMapMax > 1<<16 {
		return fmt.Errorf("invalid --lb-revnat-map-max %d: want at most 65536, the number of 16-bit reverse NAT indexes", cfg.LBRevnatMapMax)
	}
	if !maglev.IsValidSize(int(cfg.LBMaglevTableSize)) {
		return fmt.Errorf("invalid --lb-maglev-table-size %d: want one of %s", cfg.LBMaglevTableSize, joinInts(maglev.Sizes()))
	}
	switch cfg.LBAlgorithm {
	case AlgorithmRandom, AlgorithmMaglev:
	default:
		return fmt.Errorf("invalid --lb-algorithm %q: want %s or %s", cfg.LBAlgorithm, AlgorithmRandom, AlgorithmMaglev)
	}
	return nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
