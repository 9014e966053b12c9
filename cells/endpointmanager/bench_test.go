package endpointmanager_test

import (
	"context"
	"slices"
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
