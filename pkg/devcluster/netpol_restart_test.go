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

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/polltest"
)

// restartPolicies: every pod isolated for ingress; servers take port 80
// from clients; the others take anything; clients may send only to
// servers on port 80 (and to a prefix no pod is in, so that the prefix
// map has a row too).
const restartPolicies = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-clients, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: other-open, namespace: default}
spec:
  podSelector: {matchLabels: {app: other}}
  ingress: [{}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]
  - to: [{ipBlock: {cidr: 203.0.113.0/24}}]
`

// restartAllowed is what restartPolicies allow: a client to a server on
// port 80, and anyone but a client to an other.
func restartAllowed(from, to string, port uint16) bool {
	app := func(pod string) string { a, _, _ := strings.Cut(pod, "-"); return a }
	return app(from) == "client" && app(to) == "server" && port == 80 ||
		app(from) != "client" && app(to) == "other"
}

// TestNetworkPolicyRestart restarts node-1's agent (SIGTERM, then start)
// while every pod of both nodes probes every other pod on TCP ports 80
// and 81 without a pause, and checks that throughout no allowed probe
// failed or needed a retransmitted SYN, and no denied probe connected;
// and that the restarted agent, with its policy maps pinned and restored,
// wrote nothing into them (cellium_policy_map_writes_total stays 0 once
// its policy tables are computed, reconciled and pruned), and the other
// agent nothing either.
func TestNetworkPolicyRestart(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2})
	var pods []devcluster.Pod
	for _, node := range []string{"1", "2"} {
		for _, app := range []string{"server", "client", "other"} {
			p := c.AddPod("node-"+node, app+"-"+node, map[string]string{"app": app})
			c.ServeProbes(p.Name, 80, 81)
			pods = append(pods, p)
		}
	}
	c.WriteManifest("restart-policies.yaml", restartPolicies)
	r := newRestartProbes(c, pods)

	// The policy applied: every pair as it should be, in one round.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if bad := r.round(); len(bad) == 0 {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("the policy is not enforced after 30s:\n%s", strings.Join(bad, "\n"))
		}
	}
	writes2 := policyMapWrites(t, c.Node("node-2"))

	start := time.Now()
	r.start()
	r.waitRounds(t, 1)
	c.StopAgent("node-1")
	stopped := time.Now()
	// A round begun and ended while the agent is down.
	r.waitRounds(t, 2)
	down := time.Now()
	c.StartAgent("node-1")
	ready := time.Now()
	waitPolicyMapsSettled(t, c, "node-1")
	settled := time.Now()
	r.waitRounds(t, 2)
	bad, rounds, probes := r.stop()
	t.Logf("%d probes in %d rounds over %v: agent stopped after %v, down for %v (%v of it probed), ready %v after its start, policy maps settled %v later",
		probes, rounds, time.Since(start).Round(time.Millisecond), stopped.Sub(start).Round(time.Millisecond),
		ready.Sub(stopped).Round(time.Millisecond), down.Sub(stopped).Round(time.Millisecond),
		ready.Sub(down).Round(time.Millisecond), settled.Sub(ready).Round(time.Millisecond))
	if len(bad) > 0 {
		t.Errorf("%d probes disagreed with the policy across node-1's restart:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if w := policyMapWrites(t, c.Node("node-1")); w != 0 {
		t.Errorf("node-1's restarted agent made %v policy map writes, want 0 (nothing changed)", w)
	}
	if w := policyMapWrites(t, c.Node("node-2")) - writes2; w != 0 {
		t.Errorf("node-2's agent made %v policy map writes while node-1's restarted, want 0", w)
	}
}

// restartProbes probes every pair of pods on ports 80 and 81, each
// source pod's probes at once, round after round.
type restartProbes struct {
	pods    []devcluster.Pod
	probers []*devclustertest.Prober

	mu sync.Mutex
	// done are the rounds each prober finished since start.
	done   []int
	bad    []string
	probes int
	wake   chan struct{}
	quit   chan struct{}
	wg     sync.WaitGroup
}

func newRestartProbes(c *devclustertest.Cluster, pods []devcluster.Pod) *restartProbes {
	r := &restartProbes{pods: pods, done: make([]int, len(pods)), wake: make(chan struct{})}
	for _, p := range pods {
		r.probers = append(r.probers, c.Prober(p.Name))
	}
	return r
}

// Timeouts: an allowed probe has time for a retransmitted SYN, whose
// retransmission fails it anyway; a denied one has the time a connection
// here takes many times over.
const (
	restartAllowedTimeout = 3 * time.Second
	restartDeniedTimeout  = time.Second
)

// probeFrom runs one round of pod i's probes and says how each that
// disagrees with the policy did.
func (r *restartProbes) probeFrom(i int) []string {
	from := r.pods[i]
	var probes []devclustertest.Probe
	var allowed []bool
	for _, to := range r.pods {
		if to.Name == from.Name {
			continue
		}
		for _, port := range []uint16{80, 81} {
			a := restartAllowed(from.Name, to.Name, port)
			timeout := restartDeniedTimeout
			if a {
				timeout = restartAllowedTimeout
			}
			probes = append(probes, devclustertest.Probe{Protocol: devclustertest.TCP, To: netip.AddrPortFrom(to.IPv4, port), Timeout: timeout})
			allowed = append(allowed, a)
		}
	}
	at := time.Now().Format("15:04:05.000")
	var bad []string
	for k, res := range r.probers[i].Run(probes) {
		what := fmt.Sprintf("%s %s -> %s", at, from.Name, probes[k].To)
		switch {
		case allowed[k] && !res.OK:
			bad = append(bad, what+": allowed, failed: "+res.Error)
		case allowed[k] && res.Retransmits > 0:
			bad = append(bad, fmt.Sprintf("%s: allowed, connected after %d retransmissions", what, res.Retransmits))
		case !allowed[k] && res.OK:
			bad = append(bad, what+": denied, connected")
		}
	}
	r.mu.Lock()
	r.probes += len(probes)
	r.mu.Unlock()
	return bad
}

// round runs one round of every pod's probes, before start.
func (r *restartProbes) round() []string {
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for i := range r.pods {
		wg.Go(func() {
			b := r.probeFrom(i)
			mu.Lock()
			bad = append(bad, b...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(bad)
	return bad
}

// start probes from every pod, round after round, until stop.
func (r *restartProbes) start() {
	r.quit = make(chan struct{})
	r.probes = 0
	for i := range r.pods {
		r.wg.Go(func() {
			for {
				select {
				case <-r.quit:
					return
				default:
				}
				b := r.probeFrom(i)
				r.mu.Lock()
				r.bad = append(r.bad, b...)
				r.done[i]++
				close(r.wake)
				r.wake = make(chan struct{})
				r.mu.Unlock()
			}
		})
	}
}

// waitRounds waits until every pod has begun and finished n more rounds
// of probes.
func (r *restartProbes) waitRounds(t *testing.T, n int) {
	t.Helper()
	r.mu.Lock()
	want := slices.Clone(r.done)
	r.mu.Unlock()
	// A round under way now began before: it does not count.
	for i := range want {
		want[i] += n + 1
	}
	timeout := time.After(time.Minute)
	for {
		r.mu.Lock()
		ok := true
		for i := range want {
			ok = ok && r.done[i] >= want[i]
		}
		wake := r.wake
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-wake:
		case <-timeout:
			t.Fatalf("probe rounds do not end: %v done, want %v", r.done, want)
		}
	}
}

// stop ends the probing and returns the probes that disagreed, the
// rounds and the probes made.
func (r *restartProbes) stop() (bad []string, rounds, probes int) {
	close(r.quit)
	r.wg.Wait()
	slices.Sort(r.bad)
	return r.bad, slices.Min(r.done), r.probes
}

// nodeMetrics reads the metrics of node's agent (--metrics-addr, the
// default 127.0.0.1:9962 in the node's namespace).
func nodeMetrics(t *testing.T, n devcluster.Node) map[string]*dto.MetricFamily {
	t.Helper()
	code, body, err := httpGetFrom(n.NetNS, "http://127.0.0.1:9962/metrics")
	if err == nil && code != 200 {
		err = fmt.Errorf("status %d: %s", code, body)
	}
	if err != nil {
		t.Fatalf("%s's metrics: %v", n.Name, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%s's metrics: %v", n.Name, err)
	}
	return families
}

// policyMapWrites is cellium_policy_map_writes_total of node's agent, all
// maps and operations.
func policyMapWrites(t *testing.T, n devcluster.Node) float64 {
	t.Helper()
	var sum float64
	if f := nodeMetrics(t, n)["cellium_policy_map_writes_total"]; f != nil {
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// waitPolicyMapsSettled waits until node's agent has pruned each policy
// map once (which its reconcilers do once the policy is computed) and
// every row of the policy tables is reconciled: from then on nothing is
// due to be written.
func waitPolicyMapsSettled(t *testing.T, c *devclustertest.Cluster, node string) {
	t.Helper()
	cl, _ := c.Cluster.Client(node)
	polltest.Until(t, node+"'s policy maps settled", 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		last := policyMapsPending(ctx, t, c.Node(node), cl)
		return last == "", last
	})
}

// policyMapsPending says what is not yet settled, or "".
func policyMapsPending(ctx context.Context, t *testing.T, n devcluster.Node, cl *client.Client) string {
	pruned := map[string]bool{}
	if f := nodeMetrics(t, n)["cellium_reconciler_prune_duration_seconds"]; f != nil {
		for _, m := range f.GetMetric() {
			var module, name string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "module":
					module = l.GetValue()
				case "reconciler":
					name = l.GetValue()
				}
			}
			if module == "policy-maps" && m.GetHistogram().GetSampleCount() > 0 {
				pruned[name] = true
			}
		}
	}
	for _, r := range []string{"entries", "enforcement", "prefixes"} {
		if !pruned[r] {
			return fmt.Sprintf("reconciler %s has not pruned (pruned: %v)", r, pruned)
		}
	}
	for _, table := range []string{"policy-entries", "policy-enforcement", "policy-prefixes"} {
		rows, err := cl.TableRows(ctx, table, client.TableQuery{})
		if err != nil {
			return err.Error()
		}
		status := slices.Index(rows.Header, "Status")
		if status < 0 || len(rows.Rows) == 0 {
			return fmt.Sprintf("table %s: header %v, %d rows", table, rows.Header, len(rows.Rows))
		}
		for _, row := range rows.Rows {
			if !strings.HasPrefix(row[status], "Done") {
				return fmt.Sprintf("table %s: %v", table, row)
			}
		}
	}
	return ""
}
