package devcluster_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/policymap"
	"github.com/cellium/cellium/pkg/polltest"
	"github.com/cellium/cellium/pkg/procstat"
)

// convergePolicy is a NetworkPolicy that selects every app=web pod and
// allows ingress from app=client on port.
func convergePolicy(name string, port int) string {
	return fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %s, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: %d}]
`, name, port)
}

// BenchmarkPolicyConvergence: a NetworkPolicy change until every local
// endpoint's policy is in the datapath, with 100 local endpoints (one
// node, 100 pods app=web and a client pod app=client; a base policy
// isolates the web pods first). Each change is a new NetworkPolicy that
// selects the 100 pods and allows the client on a port of its own, written
// into the manifests directory, then removed. The benchmark reads the
// agent's pinned policy trie itself (no agent API in the measured path)
// every 0.5 ms for the change's key of each of the 100 endpoints (client's
// identity, TCP, the port), and takes the time from the manifest's write
// until the last endpoint's key is there (add), and from its removal until
// the last is gone (delete). The embedded mode's manifests directory
// waits for 100 ms of quiet after a change before it reads the directory
// (cells/k8sclient), so the add is also given from when the policy
// appeared in the agent's "policy-rules" table (polled through the API
// until then, every 1 ms: from_rule, from the request that first found
// it). Prints `policy-converge-bench
// endpoints=100 changes=... add_p50_ms=... add_p99_ms=...
// from_rule_p50_ms=... delete_p50_ms=...` (with 20 changes the p99 is
// the slowest).
//
//	go test ./pkg/devcluster -run '^$' -bench PolicyConvergence -benchtime 1x
func BenchmarkPolicyConvergence(b *testing.B) {
	const (
		endpoints = 100
		changes   = 20
		bpfRoot   = "/sys/fs/bpf"
	)
	c := devclustertest.Start(b, devcluster.Options{Nodes: 1, BPFRoot: bpfRoot})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cl, err := c.Cluster.Client("node-1")
	if err != nil {
		b.Fatal(err)
	}
	endpointOf := func(p devcluster.Pod) (id uint16, identity uint32) {
		e, err := cl.Endpoint(ctx, client.ContainerEndpointID(p.ContainerID))
		if err != nil {
			b.Fatal(err)
		}
		return e.ID, e.Identity
	}
	_, clientID := endpointOf(c.AddPod("node-1", "client", map[string]string{"app": "client"}))
	ids := make([]uint16, endpoints)
	for i := range ids {
		ids[i], _ = endpointOf(c.AddPod("node-1", fmt.Sprintf("web-%d", i), map[string]string{"app": "web"}))
	}
	trie, err := ebpf.LoadPinnedMap(filepath.Join(bpfRoot, c.Node("node-1").BPFPrefix, policymap.MapName), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer trie.Close()
	// written counts the endpoints whose key of port is in the trie.
	written := func(port uint16) int {
		n := 0
		for _, id := range ids {
			keys, err := policymap.KeysOf(policymap.Allow{EndpointID: id, Direction: policymap.Ingress, Identity: clientID, Proto: unix.IPPROTO_TCP, Port: port})
			if err != nil {
				b.Fatal(err)
			}
			var v policymap.Value
			err = trie.Lookup(keys[0], &v)
			switch {
			case err == nil && v.PrefixLen == policymap.PrefixFull:
				n++
			case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
				b.Fatalf("policy trie lookup: %v", err)
			}
		}
		return n
	}
	// until polls written(port) until it is want, and returns when it
	// first saw it so.
	until := func(port uint16, want int, what string) time.Time {
		var seen time.Time
		polltest.Until(b, fmt.Sprintf("%s: %d endpoints of %d with port %d's key", what, want, endpoints, port), 30*time.Second, 500*time.Microsecond, func() (bool, string) {
			seen = time.Now()
			n := written(port)
			return n == want, fmt.Sprintf("%d have it", n)
		})
		return seen
	}
	// ruleSeen polls the agent's rules table for default/name, and
	// returns a function that waits for the poll and gives when it sent
	// the first request that found it: the rule appeared before the agent
	// answered, and after the request before (a poll interval and an API
	// round trip earlier).
	ruleSeen := func(name string) func() time.Time {
		var asked time.Time
		done := make(chan error, 1)
		go func() {
			done <- polltest.Wait(name+" in the agent's policy-rules table", 30*time.Second, time.Millisecond, func() (bool, string) {
				now := time.Now()
				rows, err := cl.TableRows(ctx, "policy-rules", client.TableQuery{Index: "name", Key: "default/" + name})
				if err != nil {
					return false, err.Error()
				}
				if len(rows.Rows) == 0 {
					return false, "no row"
				}
				asked = now
				return true, ""
			})
		}()
		return func() time.Time {
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			return asked
		}
	}

	c.WriteManifest("web-base.yaml", convergePolicy("web-base", 80))
	until(80, endpoints, "base policy")
	load0 := procstat.LoadAverage()
	var adds, fromRule, deletes []time.Duration
	b.ResetTimer()
	for range b.N {
		for i := range changes {
			port := uint16(8000 + i)
			name := fmt.Sprintf("change-%d", i)
			seen := ruleSeen(name)
			t0 := time.Now()
			c.WriteManifest(name+".yaml", convergePolicy(name, int(port)))
			done := until(port, endpoints, name+" added")
			tr := seen()
			adds = append(adds, done.Sub(t0))
			fromRule = append(fromRule, max(0, done.Sub(tr)))
			t1 := time.Now()
			if err := c.RemoveManifest(name + ".yaml"); err != nil {
				b.Fatal(err)
			}
			deletes = append(deletes, until(port, 0, name+" removed").Sub(t1))
		}
	}
	b.StopTimer()
	ms := func(ds []time.Duration, p int) float64 { return float64(percentile(ds, p).Microseconds()) / 1000 }
	b.ReportMetric(ms(adds, 50), "add-p50-ms")
	b.ReportMetric(ms(fromRule, 50), "from-rule-p50-ms")
	b.ReportMetric(ms(deletes, 50), "delete-p50-ms")
	fmt.Printf("policy-converge-bench endpoints=%d changes=%d add_p50_ms=%.1f add_p99_ms=%.1f from_rule_p50_ms=%.1f from_rule_p99_ms=%.1f delete_p50_ms=%.1f delete_p99_ms=%.1f load=%s..%s\n",
		endpoints, len(adds), ms(adds, 50), ms(adds, 99), ms(fromRule, 50), ms(fromRule, 99),
		ms(deletes, 50), ms(deletes, 99), load0, procstat.LoadAverage())
}
