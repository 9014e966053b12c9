package devcluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
)

// BenchmarkCrossNodePolicyWindow measures the window of a new pod on
// node-1 (kvstore mode) before node-2 enforces policy with its identity:
// from the moment its CNI ADD returns (node-1's agent has the endpoint, its
// identity and its policy; a runtime would start the pod's containers)
// until node-2's datapath knows the pod: its ipcache map has the pod's
// address with the pod's identity, and the server's policy map an allow
// of that identity (node-2's policy: ingress to app=server from
// app=client). Until both, node-2 sees the pod's packets as from the world
// (its pod CIDR's entry) and the policy drops them. A watcher polls
// node-2's agent every millisecond from before the CNI ADD; a window it
// saw close before the ADD returned counts as 0. Each new pod has a label
// set of its own (new-identity: allocated in etcd by node-1, then watched
// by node-2) or the label set of the earlier pods (known-identity: only
// the address is new to node-2). Prints p50 and p99 of each, and checks
// that a connection then goes through.
//
//	go test ./pkg/devcluster -run '^$' -bench CrossNodePolicyWindow -benchtime 1x
func BenchmarkCrossNodePolicyWindow(b *testing.B) {
	const samples = 20
	c := devclustertest.Start(b, devcluster.Options{Nodes: 2})
	server := c.AddPod("node-2", "server", map[string]string{"app": "server"})
	c.ServeProbes("server", 80)
	c.WriteManifest("server-policy.yaml", `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-clients, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}]}]
`)
	node1, _ := c.Cluster.Client("node-1")
	node2, _ := c.Cluster.Client("node-2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	srv, err := node2.Endpoint(ctx, client.ContainerEndpointID(server.ContainerID))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		for _, variant := range []string{"new-identity", "known-identity"} {
			var windows []time.Duration
			for i := range samples {
				labels := map[string]string{"app": "client"}
				if variant == "new-identity" {
					labels["sample"] = fmt.Sprintf("s%d-%d", time.Now().UnixNano(), i)
				}
				name := fmt.Sprintf("%s-%d", strings.Split(variant, "-")[0], i)
				w := watchEnforced(ctx, node2, srv.ID, name)
				pod := c.AddPod("node-1", name, labels)
				e, err := node1.Endpoint(ctx, client.ContainerEndpointID(pod.ContainerID))
				if err != nil {
					b.Fatal(err)
				}
				enforced, err := w.wait(ctx, e.Identity)
				if err != nil {
					b.Fatalf("node-2 does not enforce with %s's identity %d: %v", name, e.Identity, err)
				}
				windows = append(windows, max(0, enforced.Sub(pod.Added)))
				to := netip.AddrPortFrom(server.IPv4, 80)
				if r := c.Prober(pod.Ref()).Run([]devclustertest.Probe{{Protocol: devclustertest.TCP, To: to, Timeout: 2 * time.Second}}); !r[0].OK {
					b.Fatalf("%s to the server after the window: %s", name, r[0].Error)
				}
				c.DeletePod(pod.Ref())
			}
			slices.Sort(windows)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			p50, p99 := windows[len(windows)/2], windows[(len(windows)*99+99)/100-1]
			b.ReportMetric(ms(p50), variant+"-p50-ms")
			b.ReportMetric(ms(p99), variant+"-p99-ms")
			fmt.Printf("policy-window-bench variant=%s samples=%d p50_ms=%.1f p99_ms=%.1f max_ms=%.1f\n", variant, samples, ms(p50), ms(p99), ms(windows[len(windows)-1]))
		}
	}
}

// enforcedWatch polls node-2's agent for a pod's address in its ipcache
// map and an allow of that address's identity in an endpoint's policy map,
// and notes when it first saw each identity so.
type enforcedWatch struct {
	mu   sync.Mutex
	seen map[uint32]time.Time
	last string
	stop context.CancelFunc
	done chan struct{}
}

func watchEnforced(ctx context.Context, cl *client.Client, endpoint uint16, pod string) *enforcedWatch {
	ctx, stop := context.WithCancel(ctx)
	w := &enforcedWatch{seen: map[uint32]time.Time{}, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			entries, err := cl.IPCache(ctx)
			now := time.Now()
			for _, e := range entries {
				if e.PodName != pod || !strings.HasSuffix(e.Prefix, "/32") || !strings.HasPrefix(e.Status, "Done") {
					continue
				}
				w.mu.Lock()
				_, have := w.seen[e.Identity]
				w.mu.Unlock()
				if have {
					continue
				}
				rows, err := cl.TableRows(ctx, "policy-entries", client.TableQuery{Index: "endpoint-identity", Key: fmt.Sprintf("%d/%d", endpoint, e.Identity)})
				ok := err == nil && slices.ContainsFunc(rows.Rows, func(r []string) bool { return strings.HasPrefix(r[len(r)-1], "Done") })
				w.mu.Lock()
				if ok {
					// The later of the two checks: both held then.
					w.seen[e.Identity] = time.Now()
				}
				w.last = fmt.Sprintf("ipcache %+v, policy entries %v %v", e, rows.Rows, err)
				w.mu.Unlock()
			}
			if err != nil {
				w.mu.Lock()
				w.last = err.Error()
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Millisecond - time.Since(now)):
			}
		}
	}()
	return w
}

// wait returns when the watch saw identity enforced, and stops it.
func (w *enforcedWatch) wait(ctx context.Context, identity uint32) (time.Time, error) {
	defer func() {
		w.stop()
		<-w.done
	}()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		w.mu.Lock()
		t, ok := w.seen[identity]
		last := w.last
		w.mu.Unlock()
		if ok {
			return t, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("after 30s: %s", last)
		case <-time.After(time.Millisecond):
		}
	}
}
