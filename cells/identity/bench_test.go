package identity

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/labels"
)

// BenchmarkAllocate allocates label sets against a real etcd: new ones
// (lock, lookups, master and value keys), from 32 goroutines as many pods
// starting at once would, then the same ones again (known: no round trip).
// Prints `identity-bench new_per_s=... known_per_s=...`.
func BenchmarkAllocate(b *testing.B) {
	etcd := etcdtest.Start(b)
	a, _ := startBenchAllocator(b, etcd.Endpoint())
	const n, workers = 2000, 32
	sets := make([]labels.Labels, n)
	for i := range sets {
		sets[i] = labels.New(labels.Label{Source: "k8s", Key: "app", Value: fmt.Sprintf("app-%d", i)},
			labels.Label{Source: "k8s", Key: NamespaceLabel, Value: "bench"})
	}
	run := func() time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < n; i += workers {
					if _, err := a.Allocate(context.Background(), sets[i]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start)
	}
	b.ResetTimer()
	newD := run()
	knownD := run()
	b.StopTimer()
	fmt.Printf("identity-bench label_sets=%d workers=%d new_per_s=%.0f known_per_s=%.0f\n",
		n, workers, n/newD.Seconds(), n/knownD.Seconds())
}
