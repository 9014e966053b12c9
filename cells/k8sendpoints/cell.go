package k8sendpoints

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/refused"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/k8sapi"
)

// Cell writes this node's pods as CelliumEndpoint objects and keeps every
// other node's in the table "k8s-endpoints" (crd identity mode).
var Cell = cell.Module(
	"k8s-endpoints",
	"Pods as CelliumEndpoint objects written for this node and read for others",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newTable, statedb.RWTable[*Endpoint].ToTable, newEndpointMetrics, newMetrics),
	cell.Invoke(register),
)

type params struct {
	cell.In

	Config     Config
	Log        *slog.Logger
	DB         *statedb.DB
	Table      statedb.RWTable[*Endpoint]
	Identities *idcell.Allocator
	IDTable    statedb.Table[*idcell.Identity]
	Metrics    *endpointMetrics
	Clientset  k8sclient.Clientset
	Endpoints  statedb.Table[*endpointmanager.Endpoint]
	Nodes      statedb.Table[*nodes.Node]
	NodeName   daemon.NodeName
	Jobs       job.Group
	Health     cell.Health
}

// syncer holds the cell's state in crd mode.
type syncer struct {
	log    *slog.Logger
	db     *statedb.DB
	tbl    statedb.RWTable[*Endpoint]
	client *k8sapi.Client
	// registered is closed once the CRDs are established.
	registered <-chan struct{}
	node       string
	cs         k8sclient.Clientset
	eps        statedb.Table[*endpointmanager.Endpoint]
	nodes      statedb.Table[*nodes.Node]
	ids        statedb.Table[*idcell.Identity]
	cfg        Config
	metrics    *endpointMetrics

	// refused names the bad objects in health.
	refused *refused.Set

	// mu serializes the checks of objects of other nodes: the watch's and
	// recheck's.
	mu sync.Mutex
	// others are the objects of other nodes, by namespace/name.
	others map[string]*k8sapi.CelliumEndpoint
	// pending are the objects of other nodes whose identity or node is
	// not known (yet), by namespace/name (pendingGrace).
	pending map[string]*pendingObject
	// pendingAdded wakes recheck to time a new pending object's grace.
	pendingAdded chan struct{}
}

// pendingObject is an object whose identity or node is not known.
type pendingObject struct {
	// since is when it was first checked so.
	since time.Time
	// refused once pendingGrace has passed.
	refused bool
}

// register adds the jobs in crd mode; in the other modes the table stays
// empty (and initialized).
func register(p params) {
	client, registered := p.Identities.CRDClient()
	if client == nil {
		p.Health.OK("Disabled: identities are not CelliumIdentity objects (--identity-allocation-mode is not crd)")
		return
	}
	s := &syncer{log: p.Log, db: p.DB, tbl: p.Table, client: client, registered: registered, node: string(p.NodeName),
		cs: p.Clientset, eps: p.Endpoints, nodes: p.Nodes, ids: p.IDTable, cfg: p.Config, metrics: p.Metrics,
		others: map[string]*k8sapi.CelliumEndpoint{}, pending: map[string]*pendingObject{}, pendingAdded: make(chan struct{}, 1),
		refused: refused.New(p.Log, p.Health.NewScope("refused"), "CelliumEndpoint")}
	txn := p.DB.WriteTxn(p.Table)
	listed := p.Table.RegisterInitializer(txn, "crd-endpoints")
	txn.Commit()
	w := newWriter(s)
	p.Jobs.Add(
		job.OneShot("watch-endpoints", func(ctx context.Context, h cell.Health) error { return s.watch(ctx, h, listed, w) }),
		job.OneShot("write-endpoints", w.run),
		job.OneShot("recheck-endpoints", s.recheck),
	)
}
