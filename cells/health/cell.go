package health

import (
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
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
	cell.ProvidePrivate(newStatusTable, newProbeServer, job.Registry.NewGroup),
	cell.Invoke(serveProbes, startWaits),
)

// serveProbes pulls the probe server into the graph, nothing depends on it,
// and watches the readiness barriers for timeouts.
func serveProbes(_ *probeServer, r *Readiness, jobs job.Group) {
	jobs.Add(job.OneShot("readiness-timeout", r.watchTimeouts))
}
