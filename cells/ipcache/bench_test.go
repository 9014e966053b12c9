package ipcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/polltest"
)

// BenchmarkKVStoreToMap writes 100,000 ip/v1 keys to a real etcd from
// another client while the ipcache follows them, and measures how long
// after the last write every one is in the BPF map, and the heap per
// entry. Prints `ipcache-bench entries=... after_writes_s=... bytes_per_entry=...`.
func BenchmarkKVStoreToMap(b *testing.B) {
	const entries = 100_000
	etcd := etcdtest.Start(b)
	root := bpfmapstest.Root(b)
	n := startNode(b, root, etcd.Endpoint(), "bench")
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	ctx := context.Background()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	b.ResetTimer()
	start := time.Now()
	ops := make([]clientv3.Op, 0, 128)
	base := netip.MustParseAddr("10.128.0.0").As4()
	for i := range entries {
		a := base
		a[1] += byte(i >> 16)
		a[2], a[3] = byte(i>>8), byte(i)
		ip := netip.AddrFrom4(a)
		v, _ := json.Marshal(ipcache.IPValue{IP: ip, HostIP: netip.MustParseAddr("192.168.0.2"), Identity: 300})
		ops = append(ops, clientv3.OpPut("bench/state/ip/v1/"+ip.String(), string(v)))
		if len(ops) == cap(ops) || i == entries-1 {
			if _, err := raw.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	written := time.Now()
	polltest.Until(b, fmt.Sprintf("%d entries in the map", entries), 2*time.Minute, 10*time.Millisecond, func() (bool, string) {
		done := 0
		for e := range n.tbl.All(n.db.ReadTxn()) {
			if e.Winner().Source == ipcache.SourceKVStore && e.Status.Kind == reconciler.StatusKindDone {
				done++
			}
		}
		return done == entries, fmt.Sprintf("%d of %d", done, entries)
	})
	inMap := time.Now()
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	fmt.Printf("ipcache-bench entries=%d writes_s=%.2f after_writes_s=%.2f bytes_per_entry=%d\n",
		entries, written.Sub(start).Seconds(), inMap.Sub(written).Seconds(), int64(after.HeapAlloc-before.HeapAlloc)/entries)
}

// BenchmarkStartListed starts an agent's kvstore, identity and ipcache
// cells against an etcd that already holds 10,000 identities and 100,000
// ip/v1 keys, and measures how long after the start both are listed (the
// tables' kvstore initializers done), and until every address is in the
// BPF map. Prints `kvstore-start-bench identities=... ip_keys=...
// listed_s=... in_map_s=...`.
func BenchmarkStartListed(b *testing.B) {
	const identities, ips = 10_000, 100_000
	etcd := etcdtest.Start(b)
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	ctx := context.Background()
	ops := make([]clientv3.Op, 0, 128)
	flush := func(last bool) {
		if len(ops) == cap(ops) || (last && len(ops) > 0) {
			if _, err := raw.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	for i := range identities {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("start/state/identities/v1/id/%d", 256+i),
			fmt.Sprintf("k8s:app=app-%d;k8s:io.kubernetes.pod.namespace=bench", i)))
		flush(i == identities-1)
	}
	base := netip.MustParseAddr("10.128.0.0").As4()
	for i := range ips {
		a := base
		a[1] += byte(i >> 16)
		a[2], a[3] = byte(i>>8), byte(i)
		ip := netip.AddrFrom4(a)
		v, _ := json.Marshal(ipcache.IPValue{IP: ip, HostIP: netip.MustParseAddr("192.168.0.2"), Identity: identity.NumericIdentity(256 + i%identities)})
		ops = append(ops, clientv3.OpPut("start/state/ip/v1/"+ip.String(), string(v)))
		flush(i == ips-1)
	}

	root := bpfmapstest.Root(b)
	var (
		db  *statedb.DB
		ids statedb.Table[*idalloc.Identity]
		ipc statedb.Table[*ipcache.Entry]
	)
	newAddrs := func(db *statedb.DB) (statedb.RWTable[*devices.NodeAddress], statedb.Table[*devices.NodeAddress], error) {
		tbl, err := statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		return tbl, tbl, err
	}
	h := celltest.New(daemon.Cell, bpfmaps.Cell, kvstore.Cell, idalloc.Cell, ipcache.Cell,
		cell.Module("test-tables", "Endpoints and node addresses filled by the test",
			cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable, newAddrs,
				nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable),
			cell.Invoke(func(d *statedb.DB, i statedb.Table[*idalloc.Identity], c statedb.Table[*ipcache.Entry], _ *idalloc.Allocator) {
				db, ids, ipc = d, i, c
			}),
		),
	)
	dir := b.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = dir+"/state", dir+"/run" })
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *kvstore.Config) {
		c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + etcd.Endpoint()}, "start"
	})

	b.ResetTimer()
	start := time.Now()
	celltest.Start(b, h)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, wait := range []func() error{
		func() error { return tables.WaitInitialized(wctx, db, ids) },
		func() error { return tables.WaitInitialized(wctx, db, ipc) },
	} {
		if err := wait(); err != nil {
			b.Fatal(err)
		}
	}
	listed := time.Since(start)
	for {
		done := 0
		for e := range ipc.All(db.ReadTxn()) {
			if e.Winner().Source == ipcache.SourceKVStore && e.Status.Kind == reconciler.StatusKindDone {
				done++
			}
		}
		if done == ips {
			break
		}
		if wctx.Err() != nil {
			b.Fatalf("%d of %d addresses in the map after 2 minutes", done, ips)
		}
		time.Sleep(10 * time.Millisecond)
	}
	inMap := time.Since(start)
	b.StopTimer()
	fmt.Printf("kvstore-start-bench identities=%d ip_keys=%d listed_s=%.2f in_map_s=%.2f\n",
		identities, ips, listed.Seconds(), inMap.Seconds())
}
