package ipcache_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/pkg/etcdtest"
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
	for {
		done := 0
		for e := range n.tbl.All(n.db.ReadTxn()) {
			if e.Winner().Source == ipcache.SourceKVStore && e.Status.Kind == reconciler.StatusKindDone {
				done++
			}
		}
		if done == entries {
			break
		}
		if time.Since(written) > 2*time.Minute {
			b.Fatalf("%d of %d entries in the map after 2 minutes", done, entries)
		}
		time.Sleep(10 * time.Millisecond)
	}
	inMap := time.Now()
	b.StopTimer()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	fmt.Printf("ipcache-bench entries=%d writes_s=%.2f after_writes_s=%.2f bytes_per_entry=%d\n",
		entries, written.Sub(start).Seconds(), inMap.Sub(written).Seconds(), int64(after.HeapAlloc-before.HeapAlloc)/entries)
}
