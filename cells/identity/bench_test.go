package identity

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/labels"
)

// BenchmarkAllocate allocates label sets against a real etcd: new ones
// (one transaction each, creating the master and the value key), from 32
// goroutines as many pods starting at once would, then the same ones
// again (known: no round trip). Beside them, the same transactions from a
// plain etcd client in the same run (same keys and values, a lease, a
// watch on the master keys): the floor the allocator is measured against
// on this machine. Prints
// `identity-bench ... new_per_s=... known_per_s=... raw_txn_per_s=...`.
func BenchmarkAllocate(b *testing.B) {
	etcd := etcdtest.Start(b)
	a, _ := startBenchAllocator(b, etcd.Endpoint())
	const n, workers = 4000, 32
	sets := make([]labels.Labels, n)
	for i := range sets {
		sets[i] = labels.New(labels.Label{Source: "k8s", Key: "app", Value: fmt.Sprintf("app-%d", i)},
			labels.Label{Source: "k8s", Key: NamespaceLabel, Value: "bench"})
	}
	run := func(op func(i int) error) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					if err := op(i); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	allocate := func(i int) error { _, err := a.Allocate(context.Background(), sets[i]); return err }
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	// The floor does what etcd does for an allocation: the same keys and
	// values, the value key on a lease, and a watch on the master keys
	// (every agent has one).
	lease, err := raw.Grant(context.Background(), 600)
	if err != nil {
		b.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for range raw.Watch(wctx, "raw/state/identities/v1/id/", clientv3.WithPrefix()) {
		}
	}()
	rawTxn := func(i int) error {
		master := fmt.Sprintf("raw/state/identities/v1/id/%d", i)
		values := "raw/state/identities/v1/value/" + sets[i].String() + "/"
		_, err := raw.Txn(context.Background()).
			If(clientv3.Compare(clientv3.CreateRevision(master), "=", 0), clientv3.Compare(clientv3.CreateRevision(values), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(master, sets[i].String()), clientv3.OpPut(values+"bench-node", strconv.Itoa(i), clientv3.WithLease(lease.ID))).Commit()
		return err
	}
	b.ResetTimer()
	rawD := run(rawTxn)
	newD := run(allocate)
	knownD := run(allocate)
	b.StopTimer()
	fmt.Printf("identity-bench label_sets=%d workers=%d new_per_s=%.0f known_per_s=%.0f raw_txn_per_s=%.0f\n",
		n, workers, n/newD.Seconds(), n/knownD.Seconds(), n/rawD.Seconds())
}

// BenchmarkKnownOneLabelSet is many endpoints of one label set taking its
// identity at once (a deployment scaling up), node-local: uses of an
// identity already in use, and their releases. Prints
// `identity-known-bench goroutines=... uses_per_s=...`.
func BenchmarkKnownOneLabelSet(b *testing.B) {
	a, _ := startBenchAllocator(b, "")
	ls := web("bench")
	ctx := context.Background()
	if _, err := a.Allocate(ctx, ls); err != nil {
		b.Fatal(err)
	}
	const goroutines, uses = 100, 2000
	start := time.Now()
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range uses {
				id, err := a.Allocate(ctx, ls)
				if err == nil {
					err = a.Release(ctx, id)
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	fmt.Printf("identity-known-bench goroutines=%d uses_per_s=%.0f\n", goroutines, goroutines*uses/d.Seconds())
}
