package k8sendpoints

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/labels"
)

// BenchmarkRemotePodIdentity measures, against a real kube-apiserver, the
// time from a pod's endpoint on node-1 (its CNI ADD done) until node-2's
// table has its identity, and the API requests node-1 makes per pod start:
//
//	go test -run '^$' -bench RemotePodIdentity -benchtime 100x ./cells/k8sendpoints/
func BenchmarkRemotePodIdentity(b *testing.B) {
	c := startClusterTB(b)
	n1, n2 := c.start(b, "node-1", b.TempDir()), c.start(b, "node-2", b.TempDir())
	ctx := context.Background()
	id, err := n1.ids.Allocate(ctx, labels.New(labels.Label{Source: "k8s", Key: "app", Value: "bench"}))
	if err != nil {
		b.Fatal(err)
	}
	client, _ := n1.ids.CRDClient()
	before := map[string]int{}
	verbs := []string{"create", "update", "delete", "get", "list", "watch"}
	for _, v := range verbs {
		before[v] = client.RequestCount(v, k8sapi.ResourceEndpoints)
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("bench-%d", i)
		c.createPod(b, name, "node-1")
		ip := netip.AddrFrom4([4]byte{10, 1, byte(1 + i/250), byte(1 + i%250)})
		start := time.Now()
		n1.putEndpoint(uint16(100+i), name, ip.String(), id)
		for {
			txn := n2.db.ReadTxn()
			row, _, found := n2.tbl.Get(txn, ByAddress.Query(ip))
			if found && row.Identity == id {
				break
			}
			_, watch := n2.tbl.AllWatch(txn)
			select {
			case <-watch:
			case <-time.After(30 * time.Second):
				b.Fatalf("pod %s not on node-2 within 30s", name)
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	for _, v := range []string{"create", "update"} {
		b.ReportMetric(float64(client.RequestCount(v, k8sapi.ResourceEndpoints)-before[v])/float64(b.N), v+"s/pod")
	}
}
