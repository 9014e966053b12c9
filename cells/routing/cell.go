package routing

import (
	"fmt"
	"log/slog"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/nodes"
)

// Cell reaches the pods of other nodes: from the nodes table it computes
// routes to their pod CIDRs (through a VXLAN device, or straight to the
// nodes), neighbor and FDB entries, as tables reconciled through netlink.
var Cell = cell.Module(
	"routing",
	"Routes neighbors and VXLAN FDB entries to other nodes pods",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(newTables, job.Registry.NewGroup, newNetlink, newRepairs),
	cell.Provide(
		statedb.RWTable[*Route].ToTable,
		statedb.RWTable[*Neighbor].ToTable,
		statedb.RWTable[*FDBEntry].ToTable,
		modeAnnotation,
		readinessWaits,
		tunnelOverhead,
		repairMetrics,
	),
	cell.Invoke(newRouter, registerReconcilers),
)

// Routing modes.
const (
	ModeTunnel = "tunnel"
	ModeNative = "native"
)

// Config is the routing cell's configuration.
type Config struct {
	// RoutingMode is how pods reach other nodes' pods: tunnel or native.
	RoutingMode string
	// TunnelPort is the UDP port of the VXLAN tunnel.
	TunnelPort uint16
}

var defaultConfig = Config{RoutingMode: ModeTunnel, TunnelPort: 8472}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("routing-mode", def.RoutingMode,
		"How pods reach other nodes' pods: tunnel (VXLAN between node addresses) or native (a route per remote pod CIDR via its node's address; nodes on one L2 segment)")
	flags.Uint16("tunnel-port", def.TunnelPort, "UDP port of the VXLAN tunnel (--routing-mode=tunnel); the same on every node")
}

func (cfg Config) validate() error {
	if cfg.RoutingMode != ModeTunnel && cfg.RoutingMode != ModeNative {
		return fmt.Errorf("invalid --routing-mode %q: want tunnel or native", cfg.RoutingMode)
	}
	if cfg.TunnelPort == 0 {
		return fmt.Errorf("invalid --tunnel-port 0: want a UDP port, such as 8472")
	}
	return nil
}

// Overhead is what encapsulation adds to a packet in mode, over an
// underlay of IPv4 (v6 false) or IPv6: the pods' MTU is the underlay's
// less this.
func (cfg Config) Overhead(v6 bool) int {
	if cfg.RoutingMode != ModeTunnel {
		return 0
	}
	// Outer IP, UDP (8), VXLAN (8) and inner Ethernet (14) headers.
	if v6 {
		return 40 + 8 + 8 + 14
	}
	return 20 + 8 + 8 + 14
}

type annotationOut struct {
	cell.Out
	Annotation nodes.Annotation `group:"node-annotations"`
}

// modeAnnotation tells other nodes' operators, on this node's Node object,
// how it routes.
func modeAnnotation(cfg Config) annotationOut {
	return annotationOut{Annotation: nodes.Annotation{Key: nodes.AnnotationRoutingMode, Value: cfg.RoutingMode}}
}

type waitsOut struct {
	cell.Out
	Routes    health.Wait `group:"readiness-waits"`
	Neighbors health.Wait `group:"readiness-waits"`
	FDB       health.Wait `group:"readiness-waits"`
}

// readinessWaits hold readiness back until every route, neighbor and fdb
// entry to the other nodes known at start is in the kernel: a node takes
// no pod before it can reach the cluster's other pods. While etcd does not
// answer they wait no more for its listing, only until what the tables
// hold is in the kernel: the routes to the nodes it knew stay, as the
// tables are not initialized (and not pruned) before it answers.
func readinessWaits(db *statedb.DB, routes statedb.RWTable[*Route], neighbors statedb.RWTable[*Neighbor], fdb statedb.RWTable[*FDBEntry], kv kvstore.Client, log *slog.Logger) waitsOut {
	return waitsOut{
		Routes:    kvstore.ReconciledUnlessUnreachable("routes-written", db, routes.ToTable(), (*Route).status, kv, log),
		Neighbors: kvstore.ReconciledUnlessUnreachable("neighbors-written", db, neighbors.ToTable(), (*Neighbor).status, kv, log),
		FDB:       kvstore.ReconciledUnlessUnreachable("fdb-written", db, fdb.ToTable(), (*FDBEntry).status, kv, log),
	}
}

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Nodes     statedb.Table[*nodes.Node]
	Devices   statedb.Table[*devices.Device]
	Routes    statedb.RWTable[*Route]
	Neighbors statedb.RWTable[*Neighbor]
	FDB       statedb.RWTable[*FDBEntry]
	Netlink   *Netlink
	Repairs   *drift.Repairs
	Jobs      job.Group
}

// newRepairs counts what the routing cell puts back in the kernel.
func newRepairs(log *slog.Logger) *drift.Repairs { return drift.NewRepairs(log, "routing") }

func repairMetrics(r *drift.Repairs) metrics.Collectors { return r.Collectors() }

func newRouter(p params) error {
	if err := p.Config.validate(); err != nil {
		return err
	}
	r := &router{cfg: p.Config, log: p.Log, db: p.DB, nodes: p.Nodes, devices: p.Devices,
		routes: p.Routes, neighbors: p.Neighbors, fdb: p.FDB, nl: p.Netlink, repairs: p.Repairs}
	txn := p.DB.WriteTxn(p.Routes, p.Neighbors, p.FDB)
	r.initialized = []func(statedb.WriteTxn){
		p.Routes.RegisterInitializer(txn, "routing-desired"),
		p.Neighbors.RegisterInitializer(txn, "routing-desired"),
		p.FDB.RegisterInitializer(txn, "routing-desired"),
	}
	txn.Commit()
	p.Jobs.Add(job.OneShot("desired", r.run))
	f := &drift.Follower{Netns: p.Netlink.path, Links: true, Routes: true, Neighbors: p.Config.RoutingMode == ModeTunnel, Handle: r.kernelChanged, Log: p.Log}
	p.Jobs.Add(job.OneShot("kernel-changes", f.Run, drift.Retry))
	return nil
}

func registerReconcilers(p reconciler.Params, nl *Netlink, repairs *drift.Repairs, routes statedb.RWTable[*Route], neighbors statedb.RWTable[*Neighbor], fdb statedb.RWTable[*FDBEntry]) error {
	if _, err := reconciler.Register(p, routes, (*Route).Clone, (*Route).withStatus,
		(*Route).status, &routeOps{nl, repairs}, &routeOps{nl, repairs}, reconciler.WithName("routes")); err != nil {
		return err
	}
	if _, err := reconciler.Register(p, neighbors, (*Neighbor).Clone, (*Neighbor).withStatus,
		(*Neighbor).status, &neighborOps{nl, repairs}, &neighborOps{nl, repairs}, reconciler.WithName("neighbors")); err != nil {
		return err
	}
	_, err := reconciler.Register(p, fdb, (*FDBEntry).Clone, (*FDBEntry).withStatus,
		(*FDBEntry).status, &fdbOps{nl, repairs}, &fdbOps{nl, repairs}, reconciler.WithName("fdb"))
	return err
}

// tunnelOverhead is what the encapsulation of this routing mode takes from
// a pod's MTU; the endpoint manager lowers the pods' MTU by it.
func tunnelOverhead(cfg Config) endpointmanager.TunnelOverhead {
	return endpointmanager.TunnelOverhead{IPv4: cfg.Overhead(false), IPv6: cfg.Overhead(true)}
}
