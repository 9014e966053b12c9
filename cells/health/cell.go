package health

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
)

// Cell provides the graph's cell.Health, the health and readiness tables,
// the probe server on --health-addr and the health API routes.
var Cell = cell.Module(
	"health",
	"Module health table readiness and kubelet probes",

	cell.Config(defaultConfig),
	cell.Provide(
		newHealth,
		newReadiness,
		statedb.RWTable[*Status].ToTable,
		apiRoutes,
	),
	cell.ProvidePrivate(newStatusTable, newProbeServer),
	cell.Invoke(serveProbes),
)

// serveProbes pulls the probe server into the graph: nothing depends on it.
func serveProbes(*probeServer) {}
