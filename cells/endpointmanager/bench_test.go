package endpointmanager_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkCreate is the agent's side of a CNI ADD, without the plugin and
// the API: addresses, state files, veth pair, addresses and routes. The
// pods' namespaces are made outside the timer.
//
//	go test -run '^$' -bench Create -benchtime 200x ./cells/endpointmanager
func BenchmarkCreate(b *testing.B) {
	tn := newTestNet(b)
	n := tn.start(b, nodeOpts{cidrs: []string{tn.v6.Addr().String() + "/112"}})
	var latencies []time.Duration
	for b.Loop() {
		b.StopTimer()
		p := newPod(b)
		b.StartTimer()
		start := time.Now()
		if _, err := n.mgr.Create(context.Background(), p.req()); err != nil {
			b.Fatal(err)
		}
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "ms/create-median")
}

// BenchmarkCreateParallel is the agent's side of -em.pods CNI ADDs that
// the runtime runs at once (a deployment scaling up), in process so that
// go test's -cpuprofile, -mutexprofile and -blockprofile see it. It prints
//
//	em-create-bench pods=100 create_p50_ms=... create_p99_ms=...
//
//	go test -run '^$' -bench CreateParallel -benchtime 1x ./cells/endpointmanager
func BenchmarkCreateParallel(b *testing.B) {
	pods := *benchPods
	for range b.N {
		b.StopTimer()
		tn := newTestNet(b)
		n := tn.start(b, nodeOpts{cidrs: []string{tn.v6.Addr().String() + "/112"}})
		ps := make([]pod, pods)
		for i := range ps {
			ps[i] = newPod(b)
			ps[i].id = fmt.Sprintf("%s-%d", ps[i].id, i)
		}
		latencies := make([]time.Duration, pods)
		errs := make(chan error, pods)
		var wg sync.WaitGroup
		b.StartTimer()
		for i, p := range ps {
			wg.Go(func() {
				start := time.Now()
				if _, err := n.mgr.Create(context.Background(), p.req()); err != nil {
					errs <- err
					return
				}
				latencies[i] = time.Since(start)
			})
		}
		wg.Wait()
		b.StopTimer()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		slices.Sort(latencies)
		fmt.Printf("em-create-bench pods=%d create_p50_ms=%.1f create_p99_ms=%.1f\n", pods,
			float64(latencies[pods/2].Microseconds())/1000, float64(latencies[(pods*99+99)/100-1].Microseconds())/1000)
		n.stop()
	}
}

var benchPods = flag.Int("em.pods", 100, "Pods whose creations BenchmarkCreateParallel runs at once")
