package ipcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/kvsync/kvsynctest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/ipcachemap"
)

// node is the ipcache cell over tables the test fills: endpoints and node
// addresses, as the endpoint manager and devices cells would.
type node struct {
	h     *hive.Hive
	db    *statedb.DB
	eps   statedb.RWTable[*endpointmanager.Endpoint]
	addrs statedb.RWTable[*devices.NodeAddress]
	nodes statedb.RWTable[*nodes.Node]
	tbl   statedb.Table[*ipcache.Entry]
	m     *ipcache.Map
	hs    statedb.Table[*health.Status]
	mets  kvsynctest.Metrics
	// endpointsListed marks the endpoints table initialized, when
	// startHeld held it back (nil otherwise).
	endpointsListed func(statedb.WriteTxn)
}

func startNode(t testing.TB, root, etcd, prefix string) *node {
	t.Helper()
	return startHeld(t, root, etcd, prefix, false)
}

// startHeld is startNode; with holdEndpoints, the endpoints table stays
// uninitialized (the endpoint manager not yet restored) until the test
// calls n.endpointsListed.
func startHeld(t testing.TB, root, etcd, prefix string, holdEndpoints bool) *node {
	t.Helper()
	n := &node{}
	newAddrs := func(db *statedb.DB) (statedb.RWTable[*devices.NodeAddress], statedb.Table[*devices.NodeAddress], error) {
		tbl, err := statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		return tbl, tbl, err
	}
	n.h = celltest.New(bpfmaps.Cell, kvstore.Cell, ipcache.Cell,
		cell.Module("test-tables", "Endpoints and node addresses filled by the test",
			cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable, newAddrs,
				nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable),
			cell.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpointmanager.Endpoint], addrs statedb.RWTable[*devices.NodeAddress],
				nodeTbl statedb.RWTable[*nodes.Node], tbl statedb.Table[*ipcache.Entry], m *ipcache.Map, hs statedb.Table[*health.Status]) {
				n.db, n.eps, n.addrs, n.nodes, n.tbl, n.m, n.hs = db, eps, addrs, nodeTbl, tbl, m, hs
			}),
			cell.Invoke(func(mets kvsynctest.Metrics) { n.mets = mets }),
			cell.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpointmanager.Endpoint]) {
				if holdEndpoints {
					txn := db.WriteTxn(eps)
					n.endpointsListed = eps.RegisterInitializer(txn, "test-endpoints")
					txn.Commit()
				}
			}),
		),
	)
	hive.AddConfigOverride(n.h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	if etcd != "" {
		hive.AddConfigOverride(n.h, func(c *kvstore.Config) {
			c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + etcd}, prefix
		})
	}
	if err := n.h.Start(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(t) })
	return n
}

func (n *node) stop(t testing.TB) {
	n.h.Stop(hivetest.Logger(t), context.Background())
}

// mapHas waits until a lookup of addr in the BPF map (the kernel's longest
// prefix match) gives identity id.
func (n *node) mapHas(t *testing.T, addr string, id identity.NumericIdentity, tunnel string) {
	t.Helper()
	k := ipcachemap.KeyOf(netip.PrefixFrom(netip.MustParseAddr(addr), netip.MustParseAddr(addr).BitLen()))
	celltest.Eventually(t, "map lookup of "+addr, func() (bool, string) {
		var val ipcachemap.Value
		if err := n.m.EBPF().Lookup(&k, &val); err != nil {
			return false, err.Error()
		}
		got := ""
		if val.TunnelAddr().IsValid() {
			got = val.TunnelAddr().String()
		}
		return identity.NumericIdentity(val.Identity) == id && got == tunnel, fmt.Sprintf("identity %d, tunnel %q", val.Identity, got)
	})
}

func (n *node) mapLacks(t *testing.T, prefix string) {
	t.Helper()
	// Not a lookup: the trie would answer with a shorter prefix.
	want := netip.MustParsePrefix(prefix)
	celltest.Eventually(t, "no map entry for "+prefix, func() (bool, string) {
		found := false
		var val ipcachemap.Value
		n.m.Iterate(func(k ipcachemap.Key, v ipcachemap.Value) bool {
			found, val = found || k.Prefix() == want, v
			return !found
		})
		return !found, fmt.Sprintf("%+v", val)
	})
}

func TestIPCache(t *testing.T) {
	etcd := etcdtest.Start(t)
	root := bpfmapstest.Root(t)
	n := startNode(t, root, etcd.Endpoint(), "ipc")
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	txn := n.db.WriteTxn(n.eps, n.addrs, n.nodes)
	n.eps.Insert(txn, &endpointmanager.Endpoint{ID: 1, ContainerID: "c1", IPv4: netip.MustParseAddr("10.0.0.5"),
		PodNamespace: "default", PodName: "web", Identity: 310})
	n.addrs.Insert(txn, &devices.NodeAddress{Addr: netip.MustParseAddr("192.168.50.1"), Device: "eth0"})
	n.nodes.Insert(txn, &nodes.Node{Name: "self", Local: true, Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.168.50.1")}}}})
	n.nodes.Insert(txn, &nodes.Node{Name: "other", Spec: nodes.Spec{
		Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.168.50.2")}},
		PodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}}})
	txn.Commit()

	// Local endpoint, host address, and the world through the kernel's
	// longest-prefix match.
	n.mapHas(t, "10.0.0.5", 310, "")
	n.mapHas(t, "192.168.50.1", identity.Host, "")
	n.mapHas(t, "8.8.4.4", identity.World, "")
	n.mapHas(t, "2001:db8::1", identity.World, "")

	// The endpoint's address is published, leased.
	celltest.Eventually(t, "the local address in the kvstore", func() (bool, string) {
		resp, err := raw.Get(ctx, "ipc/state/ip/v1/10.0.0.5")
		if err != nil {
			return false, err.Error()
		}
		if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
			return false, fmt.Sprintf("%+v", resp.Kvs)
		}
		var v ipcache.IPValue
		return json.Unmarshal(resp.Kvs[0].Value, &v) == nil && v.Identity == 310 && v.PodName == "web" &&
			v.HostIP == netip.MustParseAddr("192.168.50.1"), string(resp.Kvs[0].Value)
	})

	// Another node: its address is a remote node, its pod CIDR is behind
	// it (world, until the kvstore names a pod in it).
	n.mapHas(t, "192.168.50.2", identity.RemoteNode, "")
	n.mapHas(t, "10.0.1.99", identity.World, "192.168.50.2")

	// Deleted by someone else while the endpoint still has the address:
	// written back.
	if _, err := raw.Delete(ctx, "ipc/state/ip/v1/10.0.0.5"); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the deleted local address written back", func() (bool, string) {
		resp, err := raw.Get(ctx, "ipc/state/ip/v1/10.0.0.5")
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0, fmt.Sprintf("%+v", resp.Kvs)
	})
	n.mapHas(t, "10.0.0.5", 310, "")

	// Another node's pod, and a garbage value that changes nothing else.
	remote, _ := json.Marshal(ipcache.IPValue{IP: netip.MustParseAddr("10.0.1.7"), HostIP: netip.MustParseAddr("192.168.50.2"),
		Identity: 300, Namespace: "default", PodName: "db"})
	raw.Put(ctx, "ipc/state/ip/v1/10.0.1.8", "{not json")
	raw.Put(ctx, "ipc/state/ip/v1/10.0.1.7", string(remote))
	n.mapHas(t, "10.0.1.7", 300, "192.168.50.2")
	if e, ok := ipcache.Lookup(n.db.ReadTxn(), n.tbl, netip.MustParseAddr("10.0.1.8")); !ok || e.Prefix.Bits() == 32 {
		t.Fatalf("the garbage key made an entry: %+v", e)
	}

	// The remote pod goes: its entry leaves the map.
	raw.Delete(ctx, "ipc/state/ip/v1/10.0.1.7")
	n.mapLacks(t, "10.0.1.7/32")

	// The endpoint goes: its key leaves the kvstore.
	txn = n.db.WriteTxn(n.eps)
	n.eps.DeleteAll(txn)
	txn.Commit()
	n.mapLacks(t, "10.0.0.5/32")
	celltest.Eventually(t, "the local address gone from the kvstore", func() (bool, string) {
		resp, err := raw.Get(ctx, "ipc/state/ip/v1/10.0.0.5")
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 0, fmt.Sprintf("%+v", resp.Kvs)
	})
}

// TestRestoredStaleEntryGoes: a restart reads the pinned map back as
// restored claims, which hold while a source has not synced; an entry that
// no source claims goes once every source has synced.
func TestRestoredStaleEntryGoes(t *testing.T) {
	root := bpfmapstest.Root(t)
	n := startNode(t, root, "", "")
	txn := n.db.WriteTxn(n.eps)
	n.eps.Insert(txn, &endpointmanager.Endpoint{ID: 1, ContainerID: "c1", IPv4: netip.MustParseAddr("10.0.0.5"), Identity: 400})
	txn.Commit()
	n.mapHas(t, "10.0.0.5", 400, "")
	n.stop(t)

	// The endpoint was removed while the agent was down: this run's
	// endpoints table does not have it. Its restored entry goes once the
	// sources have synced; the world entries stay.
	m2 := startHeld(t, root, "", "", true)
	stale := netip.MustParsePrefix("10.0.0.5/32")
	celltest.Eventually(t, "the stale entry read back as a restored claim", func() (bool, string) {
		e, _, found := m2.tbl.Get(m2.db.ReadTxn(), ipcache.ByPrefix.Query(stale))
		if !found {
			return false, "no row"
		}
		return e.Winner().Source == ipcache.SourceRestored && e.Winner().Identity == 400, fmt.Sprintf("winner %+v", e.Winner())
	})
	// The endpoints have not synced: the restored entry stays in the map.
	m2.mapHas(t, "10.0.0.5", 400, "")
	txn = m2.db.WriteTxn(m2.eps)
	m2.endpointsListed(txn)
	txn.Commit()
	m2.mapLacks(t, "10.0.0.5/32")
	m2.mapHas(t, "1.2.3.4", identity.World, "")
}
