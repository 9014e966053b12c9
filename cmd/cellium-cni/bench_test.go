package main

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkAdd is the latency of a CNI ADD, from the runtime's exec of the
// built plugin to its result, against the built agent: addresses, veth
// pair, routes, two fsynced state files. The pods' namespaces are made
// outside the timer.
//
//	go test -run '^$' -bench Add -benchtime 200x ./cmd/cellium-cni
func BenchmarkAdd(b *testing.B) {
	n := newNode(b)
	n.podCIDR = n.v6.Addr().String() + "/112"
	n.start()
	conf := n.pluginConf("1.0.0")
	var latencies []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		p := n.newPod(fmt.Sprintf("b%d", i))
		env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
		b.StartTimer()
		start := time.Now()
		if _, cniErr := cniExec(b, env, conf); cniErr != nil {
			b.Fatalf("ADD: %+v", cniErr)
		}
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "ms/add-median")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "ms/add-p99")
}

// BenchmarkRestore is how long the agent takes, after kill -9, to restore
// N endpoints: "restore-ms" is the restore itself (reading the state
// files, claiming the addresses, checking every veth pair, address and
// route), "ready-ms" the time from the exec of the agent until it has
// started and restored.
//
//	go test -run '^$' -bench Restore -benchtime 5x ./cmd/cellium-cni
func BenchmarkRestore(b *testing.B) {
	for _, count := range []int{20, 1000} {
		b.Run(fmt.Sprintf("endpoints=%d", count), func(b *testing.B) {
			n := newNode(b)
			// IPv6 only: a /112 holds a thousand pods.
			n.podCIDR = n.v6.Addr().String() + "/112"
			n.start()
			conf := n.pluginConf("1.0.0")
			for i := range count {
				p := n.newPod(fmt.Sprintf("r%d", i))
				env := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": p.id, "CNI_NETNS": p.ns.Path(), "CNI_IFNAME": "eth0"}
				if _, cniErr := cniExec(b, env, conf); cniErr != nil {
					b.Fatalf("ADD %d: %+v", i, cniErr)
				}
			}
			var restore, ready []float64
			for b.Loop() {
				n.kill()
				start := time.Now()
				a := n.start()
				ready = append(ready, float64(time.Since(start).Microseconds())/1000)
				restore = append(restore, msOf(a.restored["duration"]))
				if got := a.restored["restored"]; got != float64(count) {
					b.Fatalf("restored %v endpoints, want %d", got, count)
				}
			}
			b.ReportMetric(median(restore), "restore-ms")
			b.ReportMetric(median(ready), "ready-ms")
		})
	}
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
