package ipcache

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/k8sendpoints"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/ipcachemap"
)

// Cell provides the table "ipcache", fills it from its sources, and
// reconciles it into the BPF map cellium_ipcache.
var Cell = cell.Module(
	"ipcache",
	"Prefix to security identity table and its LPM BPF map",

	cell.ProvidePrivate(NewTable, job.Registry.NewGroup, newRepairs),
	cell.Provide(NewMap, statedb.RWTable[*Entry].ToTable, apiRoutes, newMetrics, syncedBarrier),
	cell.Invoke(newIPCache, registerReconciler),
)

// Map is the pinned ipcache map the datapath reads.
type Map = bpfmaps.Map[ipcachemap.Key, ipcachemap.Value]

// NewMap declares the map. The ipcache cell provides it; tests of the
// programs that read it may provide it alone.
func NewMap(lc cell.Lifecycle, reg *bpfmaps.Registry) (*Map, error) {
	return bpfmaps.NewMap[ipcachemap.Key, ipcachemap.Value](lc, reg, bpfmaps.Spec{
		Name: ipcachemap.MapName, Type: ebpf.LPMTrie, MaxEntries: ipcachemap.MaxEntries, Flags: unix.BPF_F_NO_PREALLOC,
	})
}

// Table initializers: the map is pruned, and restored claims dropped,
// once all are done.
const (
	initLocal     = "ipcache-local-endpoints"
	initReserved  = "ipcache-node-addresses"
	initKVStore   = "ipcache-kvstore"
	initNodes     = "ipcache-nodes"
	initPublished = "ipcache-restored"
	initK8s       = "ipcache-k8s-endpoints"
)

type params struct {
	cell.In

	Log       *slog.Logger
	DB        *statedb.DB
	Table     statedb.RWTable[*Entry]
	Map       *Map
	Endpoints statedb.Table[*endpointmanager.Endpoint]
	Addresses statedb.Table[*devices.NodeAddress]
	Nodes     statedb.Table[*nodes.Node]
	KVStore   kvstore.Client
	// K8sEndpoints are other nodes' pods from their CelliumEndpoint
	// objects (crd identity mode); absent in hives without the cell.
	K8sEndpoints statedb.Table[*k8sendpoints.Endpoint] `optional:"true"`
	Repairs      *kvsync.Repairs
	Lifecycle    cell.Lifecycle
	Jobs         job.Group
}

// ipCache writes the claims of its sources into the table.
type ipCache struct {
	log *slog.Logger
	db  *statedb.DB
	tbl statedb.RWTable[*Entry]
	m   *Map
	kv  kvstore.Client

	restoredDone func(statedb.WriteTxn)
	// owner writes this node's ip/v1 keys and puts them back.
	owner *kvsync.Owner
}

func newIPCache(p params) {
	c := &ipCache{log: p.Log, db: p.DB, tbl: p.Table, m: p.Map, kv: p.KVStore}
	txn := p.DB.WriteTxn(p.Table)
	local := p.Table.RegisterInitializer(txn, initLocal)
	reserved := p.Table.RegisterInitializer(txn, initReserved)
	nodesDone := p.Table.RegisterInitializer(txn, initNodes)
	c.restoredDone = p.Table.RegisterInitializer(txn, initPublished)
	var kvListed, k8sDone func(statedb.WriteTxn)
	if p.KVStore.Enabled() {
		kvListed = p.Table.RegisterInitializer(txn, initKVStore)
	}
	if p.K8sEndpoints != nil {
		k8sDone = p.Table.RegisterInitializer(txn, initK8s)
	}
	txn.Commit()

	// After the map's open hook (appended by NewMap, which this needs).
	p.Lifecycle.Append(cell.Hook{OnStart: c.restore})
	p.Jobs.Add(
		job.OneShot("local-endpoints", func(ctx context.Context, _ cell.Health) error {
			return c.follow(ctx, SourceLocal, local, func(txn statedb.ReadTxn) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
				return localClaims(txn, p.Endpoints)
			})
		}),
		job.OneShot("node-addresses", func(ctx context.Context, _ cell.Health) error {
			return c.follow(ctx, SourceReserved, reserved, func(txn statedb.ReadTxn) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
				return reservedClaims(txn, p.Addresses)
			})
		}),
		job.OneShot("nodes", func(ctx context.Context, _ cell.Health) error {
			return c.follow(ctx, SourceNode, nodesDone, func(txn statedb.ReadTxn) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
				return nodeClaims(txn, p.Nodes)
			})
		}),
		job.OneShot("drop-restored", c.dropRestored),
	)
	if p.K8sEndpoints != nil {
		p.Jobs.Add(job.OneShot("k8s-endpoints", func(ctx context.Context, _ cell.Health) error {
			return c.follow(ctx, SourceK8s, k8sDone, func(txn statedb.ReadTxn) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
				return k8sClaims(txn, p.K8sEndpoints)
			})
		}))
	}
	if p.KVStore.Enabled() {
		c.owner = kvsync.NewOwner(p.Log, p.KVStore, p.Repairs, "pod address key")
		p.Jobs.Add(
			job.OneShot("kvstore-watch", func(ctx context.Context, h cell.Health) error {
				return c.watchKVStore(ctx, h, p.Nodes, kvListed)
			}),
			job.OneShot("kvstore-write", c.owner.Run),
			job.OneShot("kvstore-publish", func(ctx context.Context, h cell.Health) error { return c.publish(ctx, h, p.Endpoints, p.Nodes) }),
		)
	}
}

// restore reads the pinned map back as restored claims, so the datapath
// keeps its entries until every source has synced.
func (c *ipCache) restore(cell.HookContext) error {
	txn := c.db.WriteTxn(c.tbl)
	defer txn.Abort()
	n := 0
	err := c.m.Iterate(func(k ipcachemap.Key, v ipcachemap.Value) bool {
		p := k.Prefix()
		if !p.IsValid() {
			return true
		}
		c.claim(txn, p, Claim{Source: SourceRestored, Identity: identity.NumericIdentity(v.Identity), HostIP: v.TunnelAddr(), Flags: v.Flags})
		n++
		return true
	})
	if err != nil {
		return err
	}
	txn.Commit()
	if n > 0 {
		c.log.Info("Restored ipcache entries from the pinned map", "entries", n)
	}
	return nil
}

// dropRestored removes the restored claims once every source is synced:
// what no source claims then leaves the map.
func (c *ipCache) dropRestored(ctx context.Context, _ cell.Health) error {
	txn := c.db.WriteTxn(c.tbl)
	c.restoredDone(txn)
	txn.Commit()
	if tables.WaitInitialized(ctx, c.db, c.tbl) != nil {
		return nil // stopping
	}
	wtxn := c.db.WriteTxn(c.tbl)
	defer wtxn.Abort()
	dropped := 0
	for e := range c.tbl.All(wtxn) {
		if c.unclaim(wtxn, e.Prefix, SourceRestored) {
			dropped++
		}
	}
	wtxn.Commit()
	c.log.Info("Every ipcache source has synced", "stale-restored-dropped", dropped)
	return nil
}

// claim sets source's claim on p; unclaim removes it.
func (c *ipCache) claim(txn statedb.WriteTxn, p netip.Prefix, cl Claim) {
	e, _, found := c.tbl.Get(txn, ByPrefix.Query(p))
	if !found {
		e = &Entry{Prefix: p}
	}
	e, changed := e.withClaim(cl)
	if changed {
		e.Status = reconciler.StatusPending()
		c.tbl.Insert(txn, e)
	}
}

func (c *ipCache) unclaim(txn statedb.WriteTxn, p netip.Prefix, source Source) bool {
	e, _, found := c.tbl.Get(txn, ByPrefix.Query(p))
	if !found {
		return false
	}
	out, changed := e.withoutClaim(source)
	switch {
	case !changed:
	case out == nil:
		c.tbl.Delete(txn, e)
	default:
		out.Status = reconciler.StatusPending()
		c.tbl.Insert(txn, out)
	}
	return changed
}

// follow keeps source's claims equal to what desired computes from the
// tables it reads, again whenever they change; done marks the source's
// initializer once desired says its inputs are complete.
func (c *ipCache) follow(ctx context.Context, source Source, done func(statedb.WriteTxn),
	desired func(statedb.ReadTxn) (map[netip.Prefix]Claim, <-chan struct{}, bool)) error {
	applied := map[netip.Prefix]Claim{}
	for {
		want, watch, complete := desired(c.db.ReadTxn())
		if !maps.Equal(want, applied) || (complete && done != nil) {
			txn := c.db.WriteTxn(c.tbl)
			for p := range applied {
				if _, ok := want[p]; !ok {
					c.unclaim(txn, p, source)
				}
			}
			for p, cl := range want {
				if applied[p] != cl {
					c.claim(txn, p, cl)
				}
			}
			if complete && done != nil {
				done(txn)
				done = nil
			}
			txn.Commit()
			applied = want
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
}

func hostPrefix(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen())
}

// localClaims are the addresses of the endpoints of this node.
func localClaims(txn statedb.ReadTxn, eps statedb.Table[*endpointmanager.Endpoint]) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
	out := map[netip.Prefix]Claim{}
	all, watch := eps.AllWatch(txn)
	for ep := range all {
		id := ep.Identity
		if id == identity.Unknown {
			id = identity.Init
		}
		for _, ip := range ep.IPs() {
			out[hostPrefix(ip)] = Claim{Source: SourceLocal, Identity: id, Namespace: ep.PodNamespace, PodName: ep.PodName,
				Flags: ipcachemap.FlagLocalEndpoint}
		}
	}
	watch, init := untilInitialized(txn, eps, watch)
	return out, watch, init
}

// k8sClaims are the addresses of other nodes' pods from their
// CelliumEndpoint objects; of two objects with one address, the newer.
func k8sClaims(txn statedb.ReadTxn, tbl statedb.Table[*k8sendpoints.Endpoint]) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
	out := map[netip.Prefix]Claim{}
	newest := map[netip.Prefix]*k8sendpoints.Endpoint{}
	all, watch := tbl.AllWatch(txn)
	for ep := range all {
		for _, ip := range ep.Addresses {
			p := hostPrefix(ip)
			if prev := newest[p]; prev != nil && (prev.Created.After(ep.Created) || prev.Created.Equal(ep.Created) && prev.Key() < ep.Key()) {
				continue
			}
			newest[p] = ep
			out[p] = Claim{Source: SourceK8s, Identity: ep.Identity, HostIP: ep.NodeIP, Namespace: ep.Namespace, PodName: ep.Name}
		}
	}
	watch, init := untilInitialized(txn, tbl, watch)
	return out, watch, init
}

// untilInitialized is what a source waits on: while tbl is not initialized,
// its initialization, which may come without a change of its objects (a
// restore that found nothing); then watch. It also says whether tbl is
// initialized.
func untilInitialized[Obj any](txn statedb.ReadTxn, tbl statedb.Table[Obj], watch <-chan struct{}) (<-chan struct{}, bool) {
	init, initWatch := tbl.Initialized(txn)
	if !init {
		return initWatch, false
	}
	return watch, true
}

// reservedClaims are the world prefixes and the node's own addresses.
func reservedClaims(txn statedb.ReadTxn, addrs statedb.Table[*devices.NodeAddress]) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
	out := map[netip.Prefix]Claim{
		netip.MustParsePrefix("0.0.0.0/0"): {Source: SourceReserved, Identity: identity.World},
		netip.MustParsePrefix("::/0"):      {Source: SourceReserved, Identity: identity.World},
	}
	all, watch := addrs.AllWatch(txn)
	for a := range all {
		out[hostPrefix(a.Addr)] = Claim{Source: SourceReserved, Identity: identity.Host}
	}
	watch, init := untilInitialized(txn, addrs, watch)
	return out, watch, init
}

// nodeClaims are the other nodes' addresses (remote-node) and pod CIDRs
// (world, behind the node: its address is their tunnel endpoint; the
// kvstore names each pod within them).
func nodeClaims(txn statedb.ReadTxn, tbl statedb.Table[*nodes.Node]) (map[netip.Prefix]Claim, <-chan struct{}, bool) {
	out := map[netip.Prefix]Claim{}
	all, watch := tbl.AllWatch(txn)
	for n := range all {
		if n.Local {
			continue
		}
		for _, a := range n.Addresses {
			out[hostPrefix(a.IP)] = Claim{Source: SourceNode, Identity: identity.RemoteNode}
		}
		tunnel := n.PrimaryIP()
		for _, cidr := range n.PodCIDRs {
			out[cidr] = Claim{Source: SourceNode, Identity: identity.World, HostIP: tunnel}
		}
	}
	watch, init := untilInitialized(txn, tbl, watch)
	return out, watch, init
}
