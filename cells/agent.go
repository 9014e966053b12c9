// Package cells assembles the agent: every cell, grouped as the architecture
// page groups them. The order of cells here does not decide the order in
// which they start; their dependencies do (`agent hive` prints the result).
// The one exception is health.StartedMarker, which must come last.
package cells

import (
	"io"
	"log/slog"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/clusterhealth"
	"github.com/cellium/cellium/cells/ctgc"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/hubble"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sendpoints"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/lbhealthcheck"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/loader"
	"github.com/cellium/cellium/cells/masquerade"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/cells/policymaps"
	"github.com/cellium/cellium/cells/routing"
	"github.com/cellium/cellium/cells/sysctl"
)

// Infrastructure is what every other cell builds on.
var Infrastructure = cell.Group(
	daemon.Cell,
	statedb.Cell,
	job.Cell,
	health.Cell,
	metrics.Cell,
	api.Cell,
	sysctl.Cell,
	bpfmaps.Cell,
	k8sclient.Cell,
	kvstore.Cell,
	devices.Cell,
)

// ControlPlane computes desired state into StateDB tables.
var ControlPlane = cell.Group(
	ipam.Cell,
	identity.Cell,
	endpointmanager.Cell,
	policy.Cell,
	k8sendpoints.Cell,
	ipcache.Cell,
	nodes.Cell,
	routing.Cell,
	clusterhealth.Cell,
	loadbalancer.Cell,
	lbhealthcheck.Cell,
)

// Datapath reconciles tables into the kernel.
var Datapath = cell.Group(
	endpointmaps.Cell,
	policymaps.Cell,
	lbmaps.Cell,
	ctmaps.Cell,
	loader.Cell,
	ctgc.Cell,
	masquerade.Cell,
	monitor.Cell,
	hubble.Cell,
)

// Agent is every cell of the agent.
var Agent = cell.Group(
	Infrastructure,
	ControlPlane,
	Datapath,
)

// EnvPrefix prefixes the environment variable of every flag: --state-dir can
// also be set with AGENT_STATE_DIR.
const EnvPrefix = "AGENT_"

// Options are the hive options of the agent.
func Options() hive.Options {
	opts := hive.DefaultOptions()
	// The environment is read by pkg/flagsource (cmd/agent), which parses
	// each AGENT_* value with its flag's parser, names the variable in its
	// errors, and sets the flag. Hive binds a variable to every flag
	// whatever its options say; with the same prefix it binds the very
	// variable flagsource already turned into a set flag, which viper
	// ranks above the environment, so it never decides a value. (With no
	// prefix it would read unprefixed names such as STATE_DIR.)
	opts.EnvPrefix = EnvPrefix
	opts.ModuleDecorators = health.ModuleDecorators
	// Log every start and stop hook at Info: the log then shows the graph
	// starting, cell by cell, in dependency order.
	opts.LogThreshold = 0
	opts.StopTimeout = 30 * time.Second
	return opts
}

// NewHive builds the agent's hive, with extra cells (a command's invokes)
// besides the agent's. Its flags are those of every cell.
func NewHive(extra ...cell.Cell) *hive.Hive {
	var h *hive.Hive
	cells := []cell.Cell{
		Agent,
		cell.Provide(func() api.ObjectPrinter { return objectPrinter(h) }),
	}
	cells = append(cells, extra...)
	cells = append(cells, health.StartedMarker) // last: see its documentation
	h = hive.NewWithOptions(Options(), cells...)
	return h
}

// objectPrinter prints h's objects for GET /v1/hive. The hive is populated by
// the time anyone asks, so PrintObjects does not log.
func objectPrinter(h *hive.Hive) api.ObjectPrinter {
	return func(w io.Writer) error { return h.PrintObjects(w, slog.Default()) }
}
