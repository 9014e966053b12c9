package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/backoff"
)

// Cell provides the table "nodes": this node and every other node of the
// cluster, from Kubernetes Node objects and the kvstore; it publishes this
// node to the kvstore and annotates and marks ready its Node object.
var Cell = cell.Module(
	"nodes",
	"Local and remote nodes from Kubernetes and the kvstore",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(NewTable, job.Registry.NewGroup, newRepairs, newLocalMetrics),
	cell.Provide(statedb.RWTable[*Node].ToTable, apiRoutes, newMetrics),
	cell.Invoke(newNodes),
)

// Config is the nodes cell's configuration.
type Config struct {
	// NodeIP are this node's addresses for other nodes, at most one per
	// family; empty: the primary addresses of the device that holds the
	// default route.
	NodeIP []string
}

var defaultConfig = Config{}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.StringSlice("node-ip", def.NodeIP,
		"This node's address for other nodes (tunnel endpoint, routes), at most one IPv4 and one IPv6; empty: the addresses of the device that holds the default route")
}

// parse checks --node-ip without I/O.
func (cfg Config) parse() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range cfg.NodeIP {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		if err != nil || a.Zone() != "" || !a.IsGlobalUnicast() {
			return nil, fmt.Errorf("invalid --node-ip %q: want a unicast IPv4 or IPv6 address without zone, such as 192.168.1.10", s)
		}
		for _, o := range out {
			if o.Is4() == a.Is4() {
				return nil, fmt.Errorf("invalid --node-ip %s: two addresses of one family (%s, %s); give at most one IPv4 and one IPv6", strings.Join(cfg.NodeIP, ","), o, a)
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// Annotation is one annotation of this node's Node object that a cell
// contributes (group "node-annotations"): the routing cell its mode, say.
type Annotation struct {
	Key, Value string
}

// Table initializers: the table is complete once all are done.
const (
	initLocal   = "nodes-local"
	initK8s     = "nodes-k8s"
	initKVStore = "nodes-kvstore"
)

type params struct {
	cell.In

	Config        Config
	Log           *slog.Logger
	DB            *statedb.DB
	Table         statedb.RWTable[*Node]
	NodeName      daemon.NodeName
	IPAM          *ipam.IPAM
	Devices       statedb.Table[*devices.Device]
	NodeAddresses statedb.Table[*devices.NodeAddress]
	Endpoints     statedb.Table[*endpointmanager.Endpoint]
	DevicesConfig devices.Config
	KVStore       kvstore.Client
	Repairs       *kvsync.Repairs
	LocalMetrics  localMetrics
	Clientset     k8sclient.Clientset
	Readiness     *health.Readiness
	Annotations   []Annotation `group:"node-annotations"`
	Jobs          job.Group
	Health        cell.Health
}

// nodes writes the table from the claims of its sources.
type nodes struct {
	log    *slog.Logger
	db     *statedb.DB
	tbl    statedb.RWTable[*Node]
	kv     kvstore.Client
	name   string
	claims *claims
	// localDone marks the local node known; merge calls it.
	localDone func(statedb.WriteTxn)
}

func newNodes(p params) error {
	nodeIPs, err := p.Config.parse()
	if err != nil {
		return err
	}
	n := &nodes{log: p.Log, db: p.DB, tbl: p.Table, kv: p.KVStore, name: string(p.NodeName), claims: newClaims(string(p.NodeName), p.KVStore.Enabled())}
	txn := p.DB.WriteTxn(p.Table)
	n.localDone = p.Table.RegisterInitializer(txn, initLocal)
	k8sSynced := p.Table.RegisterInitializer(txn, initK8s)
	var kvListed func(statedb.WriteTxn)
	if p.KVStore.Enabled() {
		kvListed = p.Table.RegisterInitializer(txn, initKVStore)
	}
	txn.Commit()

	local := &localNode{log: p.Log, nodes: n, ipam: p.IPAM, configured: nodeIPs, devices: p.Devices,
		addrs: p.NodeAddresses, endpoints: p.Endpoints, netnsPath: p.DevicesConfig.DevicesNetns,
		metrics: p.LocalMetrics}
	k8s := newNodeWatcher(p.Log, p.Clientset, n)
	p.Jobs.Add(
		job.OneShot("merge", n.merge),
		job.OneShot("local-node", local.run, job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: time.Minute})),
		job.OneShot("k8s-nodes", func(ctx context.Context, h cell.Health) error { return k8s.run(ctx, h, k8sSynced) }),
		job.OneShot("annotate-node", func(ctx context.Context, h cell.Health) error {
			return annotate(ctx, h, p.Log, p.Clientset, k8s, n, p.Annotations)
		}, job.WithRetry(-1, &backoff.Jittered{Min: time.Second, Max: time.Minute})),
		job.OneShot("mark-node-ready", func(ctx context.Context, h cell.Health) error {
			return markReady(ctx, h, p.Log, p.Clientset, k8s, n.name, p.Readiness)
		}, job.WithRetry(-1, &backoff.Jittered{Min: time.Second, Max: time.Minute})),
	)
	if p.KVStore.Enabled() {
		kv := &kvstoreNodes{nodes: n, owner: kvsync.NewOwner(p.Log, p.KVStore, p.Repairs, "node key")}
		p.Jobs.Add(
			job.OneShot("kvstore-watch", func(ctx context.Context, h cell.Health) error { return kv.watch(ctx, h, kvListed) }),
			job.OneShot("kvstore-publish", kv.publish),
			job.OneShot("kvstore-write", kv.owner.Run),
		)
	}
	return nil
}

// mergeDelay gathers the claims that change together (a listing of many
// nodes) into one write of the table.
const mergeDelay = 10 * time.Millisecond

// merge keeps the table equal to the claims' rows: on each change, after
// mergeDelay, it writes the rows that differ and deletes those of nodes no
// source claims any more, in one transaction.
func (n *nodes) merge(ctx context.Context, health cell.Health) error {
	for {
		select {
		case <-n.claims.changed:
		case <-ctx.Done():
			return nil
		}
		select {
		case <-time.After(mergeDelay):
		case <-ctx.Done():
			return nil
		}
		complete := n.claims.takeComplete()
		rows := n.claims.rows()
		txn := n.db.WriteTxn(n.tbl)
		for old := range n.tbl.All(txn) {
			if _, ok := rows[old.Name]; !ok {
				n.tbl.Delete(txn, old)
				n.log.Info("Node left", "node", old.Name)
			}
		}
		var problems []string
		for _, row := range rows {
			if old, _, found := n.tbl.Get(txn, ByName.Query(row.Name)); !found || !old.equal(row) {
				n.tbl.Insert(txn, row)
				for _, p := range row.Problems {
					if !found || !slices.Contains(old.Problems, p) {
						n.log.Warn("Part of a node's description is ignored", "node", row.Name, "source", row.Source, "problem", p)
					}
				}
			}
			for _, p := range row.Problems {
				problems = append(problems, row.Name+": "+p)
			}
			if row.Local && n.localDone != nil {
				n.localDone(txn)
				n.localDone = nil
			}
		}
		for _, initialized := range complete {
			initialized(txn)
		}
		txn.Commit()
		if len(problems) > 0 {
			health.Degraded(fmt.Sprintf("%d nodes, %d problems", len(rows), len(problems)), fmt.Errorf("%s", strings.Join(problems, "; ")))
		} else {
			health.OK(fmt.Sprintf("%d nodes", len(rows)))
		}
	}
}
