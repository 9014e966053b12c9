package loadbalancer

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/k8sclient"
)

// Cell provides the services, frontends and backends tables, kept current
// from Kubernetes Services and EndpointSlices and the node's addresses.
var Cell = cell.Module(
	"loadbalancer",
	"Services frontends and backends from Kubernetes",

	cell.ProvidePrivate(newTables, newWriter, job.Registry.NewGroup),
	cell.Provide(provideTables, newBackendHealth, apiRoutes, k8sSynced),
	cell.Invoke(startWriter),
)

type tablesOut struct {
	cell.Out

	Services    statedb.Table[*Service]
	Frontends   statedb.Table[*Frontend]
	FrontendsRW statedb.RWTable[*Frontend]
	Backends    statedb.Table[*SliceBackends]
}

func provideTables(t *lbTables) tablesOut {
	return tablesOut{
		Services:    t.services,
		Frontends:   t.frontends,
		FrontendsRW: t.frontends,
		Backends:    t.backends,
	}
}

type writerParams struct {
	cell.In

	Log           *slog.Logger
	DB            *statedb.DB
	Tables        *lbTables
	NodeAddresses statedb.Table[*devices.NodeAddress]
	NodeName      daemon.NodeName
	Clientset     k8sclient.Clientset
	Jobs          job.Group
	Health        cell.Health
	// Programmed is lb-maps' (absent without it, as in some tests).
	Programmed Programmed `optional:"true"`
}

// newWriter builds the writer and adds the jobs that feed it: a reflector
// per resource, the batch writer they queue to, and the node address
// watcher.
func newWriter(p writerParams) *writer {
	w := &writer{
		log:       p.Log,
		db:        p.DB,
		tables:    p.Tables,
		nodeName:  string(p.NodeName),
		health:    p.Health.NewScope("k8s-objects"),
		slices:    sliceServices{},
		problems:  map[string]string{},
		contested: map[ServiceName]struct{}{},

		programmed: p.Programmed,

		quarantined: map[L3n4Addr]struct{}{},
	}
	events := make(chan k8sEvent, eventQueueSize)
	p.Jobs.Add(
		job.OneShot("reflect-services", func(ctx context.Context, health cell.Health) error {
			store := serviceStore(ctx, events)
			runReflector(ctx, "services", &corev1.Service{}, servicesListWatch(p.Clientset, health, store), store)
			return nil
		}),
		job.OneShot("reflect-endpointslices", func(ctx context.Context, health cell.Health) error {
			store := endpointSliceStore(ctx, events)
			runReflector(ctx, "endpointslices", &discoveryv1.EndpointSlice{}, endpointSlicesListWatch(p.Clientset, health, store), store)
			return nil
		}),
		job.OneShot("apply-k8s-events", func(ctx context.Context, _ cell.Health) error {
			w.processEvents(ctx, events)
			return nil
		}),
		job.OneShot("watch-node-addresses", func(ctx context.Context, _ cell.Health) error {
			watchNodeAddresses(ctx, p.DB, p.NodeAddresses, w)
			return nil
		}),
	)
	return w
}

// startWriter pulls the writer, and with it the jobs, into the graph:
// the tables must fill even before anyone reads them.
func startWriter(*writer) {}

// watchNodeAddresses hands the writer every new set of node addresses until
// ctx ends.
func watchNodeAddresses(ctx context.Context, db *statedb.DB, tbl statedb.Table[*devices.NodeAddress], w *writer) {
	for {
		txn := db.ReadTxn()
		rows, changed := tbl.AllWatch(txn)
		var addrs []netip.Addr
		for a := range rows {
			addrs = append(addrs, a.Addr.Unmap())
		}
		slices.SortFunc(addrs, netip.Addr.Compare)
		addrs = slices.Compact(addrs)
		initialized, initWatch := tbl.Initialized(txn)
		w.setNodeAddresses(ctx, addrs, initialized)
		if initialized {
			initWatch = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-initWatch:
		}
	}
}
