package routing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/cells/routing"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// BenchmarkNodesAppear: 1,000 nodes appear at once in the kvstore of an
// agent (tunnel mode, in a namespace of its own), written by another
// client in a few transactions; the time
// until every route, neighbor and fdb entry is in the kernel and every
// node's address and pod CIDR in the ipcache's BPF map, and the heap per
// node. Prints `nodes-bench nodes=... in_kernel_s=... bytes_per_node=...`.
func BenchmarkNodesAppear(b *testing.B) {
	const count = 1000
	nettest.RequireRoot(b)
	ns := nettest.NewNS(b)
	err := nettest.Do(ns.Path(), func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer"}); err != nil {
			return err
		}
		eth0, _ := netlink.LinkByName("eth0")
		if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix("172.16.0.1/16"))}); err != nil {
			return err
		}
		return netlink.LinkSetUp(eth0)
	})
	if err != nil {
		b.Fatal(err)
	}
	var (
		db  *statedb.DB
		rt  statedb.Table[*routing.Route]
		nb  statedb.Table[*routing.Neighbor]
		fdb statedb.Table[*routing.FDBEntry]
		ipc statedb.Table[*ipcache.Entry]
	)
	etcd := etcdtest.Start(b)
	h := celltest.New(daemon.Cell, ipam.Cell, devices.Cell, kvstore.Cell, k8sclienttest.Cell(),
		nodes.Cell, routing.Cell, bpfmaps.Cell, ipcache.Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(d *statedb.DB, r statedb.Table[*routing.Route], n statedb.Table[*routing.Neighbor],
			f statedb.Table[*routing.FDBEntry], i statedb.Table[*ipcache.Entry]) {
			db, rt, nb, fdb, ipc = d, r, n, f, i
		}))
	dir := b.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), "bench-0"
	})
	hive.AddConfigOverride(h, func(c *ipam.Config) { c.PodCIDR = []string{"10.100.0.0/24"} })
	hive.AddConfigOverride(h, func(c *nodes.Config) { c.NodeIP = []string{"172.16.0.1"} })
	hive.AddConfigOverride(h, func(c *devices.Config) { c.DevicesNetns = ns.Path() })
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = bpfmapstest.Root(b) })
	hive.AddConfigOverride(h, func(c *kvstore.Config) {
		c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + etcd.Endpoint()}, "bench"
	})
	celltest.Start(b, h)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()

	ops := make([]clientv3.Op, 0, count)
	for i := range count {
		name := fmt.Sprintf("bench-%d", i+1)
		v, _ := json.Marshal(nodes.Value{Name: name, Spec: nodes.Spec{
			Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.AddrFrom4([4]byte{172, 16, byte((i + 2) >> 8), byte(i + 2)})}},
			PodCIDRs:  []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte((i+1)>>8), byte(i + 1), 0}), 24)},
		}})
		ops = append(ops, clientv3.OpPut("bench/state/nodes/v1/"+name, string(v)))
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	start := time.Now()
	for len(ops) > 0 {
		n := min(len(ops), 128)
		if _, err := raw.Txn(context.Background()).Then(ops[:n]...).Commit(); err != nil {
			b.Fatal(err)
		}
		ops = ops[n:]
	}
	polltest.Until(b, fmt.Sprintf("every one of %d nodes in the kernel", count), 2*time.Minute, 10*time.Millisecond, func() (bool, string) {
		txn := db.ReadTxn()
		routes := countDone(rt.All(txn), func(r *routing.Route) reconciler.Status { return r.Status })
		neighs := countDone(nb.All(txn), func(n *routing.Neighbor) reconciler.Status { return n.Status })
		fdbs := countDone(fdb.All(txn), func(f *routing.FDBEntry) reconciler.Status { return f.Status })
		ipcs := countDone(ipc.All(txn), func(e *ipcache.Entry) reconciler.Status {
			if e.Winner().Source != ipcache.SourceNode {
				return reconciler.StatusPending()
			}
			return e.Status
		})
		return routes == count && neighs == count && fdbs == count && ipcs == 2*count,
			fmt.Sprintf("done: %d routes, %d neighbors, %d fdb entries, %d ipcache entries (want %d, %d, %d, %d)", routes, neighs, fdbs, ipcs, count, count, count, 2*count)
	})
	took := time.Since(start)
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	fmt.Printf("nodes-bench nodes=%d in_kernel_s=%.2f bytes_per_node=%d\n", count, took.Seconds(), int64(after.HeapAlloc-before.HeapAlloc)/count)
}

func countDone[T any](rows func(func(T, statedb.Revision) bool), status func(T) reconciler.Status) int {
	n := 0
	for r := range rows {
		if status(r).Kind == reconciler.StatusKindDone {
			n++
		}
	}
	return n
}
