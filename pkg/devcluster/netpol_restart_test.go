package devcluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/policymap"
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
	return app(from) == "client" && app(to) == "server" && port == 80 ||
		app(from) != "client" && app(to) == "other"
}

// app is the app of a pod of these tests, from its name ("client-1").
func app(pod string) string { a, _, _ := strings.Cut(pod, "-"); return a }

// changedPolicies is restartPolicies changed: servers take port 80 from
// others instead of clients, and others take only servers. On each node,
// entries are deleted (of the clients' identity, and an allow-all) and
// written (of the others' and the servers' identities).
var changedPolicies = strings.NewReplacer(
	"- from: [{podSelector: {matchLabels: {app: client}}}]", "- from: [{podSelector: {matchLabels: {app: other}}}]",
	"  podSelector: {matchLabels: {app: other}}\n  ingress: [{}]",
	"  podSelector: {matchLabels: {app: other}}\n  ingress:\n  - from: [{podSelector: {matchLabels: {app: server}}}]",
).Replace(restartPolicies)

// changedAllowed is what changedPolicies allow: an other to a server on
// port 80, and a server to an other.
func changedAllowed(from, to string, port uint16) bool {
	return app(from) == "other" && app(to) == "server" && port == 80 ||
		app(from) == "server" && app(to) == "other"
}

// TestNetworkPolicyRestart restarts node-1's agent while every pod of both
// nodes probes every other pod on TCP ports 80 and 81 without a pause:
// stopped (SIGTERM), then killed (SIGKILL: no stop hook runs), then killed
// in the middle of writing a policy change into its maps. Each subtest
// goes on from the cluster the one before left.
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
	r := newRestartProbes(c, pods, only(restartAllowed))
	r.waitEnforced(t, 30*time.Second)

	for _, down := range []struct {
		name string
		down func(node string)
	}{
		{"SIGTERM", c.StopAgent},
		{"SIGKILL", c.KillAgent},
	} {
		if !t.Run(down.name, func(t *testing.T) { testRestartUnderProbes(t, c, r, down.down) }) {
			return
		}
	}
	if !t.Run("veth-remade", func(t *testing.T) { testVethRemadeAtRestart(t, c, r) }) {
		return
	}
	t.Run("kill-during-convergence", func(t *testing.T) { testKillDuringConvergence(t, c, r) })
}

// testVethRemadeAtRestart kills node-1's agent, deletes server-1's veth
// pair while it is down, and starts it again, which makes a new pair for
// the pod. From before the agent starts until the endpoint is ready, the
// pods that server-1's policy denies probe it every few milliseconds: none
// may connect, as they would through a host side routed before its
// programs are attached. Then every pair must be as the policy says.
func testVethRemadeAtRestart(t *testing.T, c *devclustertest.Cluster, r *restartProbes) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, _ := c.Cluster.Client("node-1")
	server := c.Pod("server-1")
	ep, err := cl.Endpoint(ctx, client.ContainerEndpointID(server.ContainerID))
	if err != nil {
		t.Fatal(err)
	}
	c.KillAgent("node-1")
	if out, err := exec.Command("nsenter", "--net="+c.Node("node-1").NetNS, "ip", "link", "del", ep.HostInterface).CombinedOutput(); err != nil {
		t.Fatalf("delete %s in node-1: %v: %s", ep.HostInterface, err, out)
	}

	// Denied: others to servers, clients to servers on port 81.
	type deniedProbe struct {
		prober *devclustertest.Prober
		what   string
		probe  devclustertest.Probe
	}
	var probes []deniedProbe
	for i, p := range r.pods {
		port, ok := uint16(80), app(p.Name) == "other"
		if app(p.Name) == "client" {
			port, ok = 81, true
		}
		if !ok {
			continue
		}
		to := netip.AddrPortFrom(server.IPv4, port)
		probes = append(probes, deniedProbe{r.probers[i], p.Name + " -> " + to.String(), devclustertest.Probe{Protocol: devclustertest.TCP, To: to, Timeout: 200 * time.Millisecond}})
	}
	var (
		mu        sync.Mutex
		connected []string
		sent      int
		wg        sync.WaitGroup
	)
	quit := make(chan struct{})
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			for _, p := range probes {
				wg.Go(func() {
					at := time.Now().Format("15:04:05.000")
					res := p.prober.Run([]devclustertest.Probe{p.probe})[0]
					mu.Lock()
					defer mu.Unlock()
					sent++
					if res.OK {
						connected = append(connected, at+" "+p.what)
					}
				})
			}
		}
	})
	start := time.Now()
	c.StartAgent("node-1")
	ready := time.Now()
	polltest.Until(t, "server-1's endpoint ready on a new veth pair", 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		now, err := cl.Endpoint(ctx, client.ContainerEndpointID(server.ContainerID))
		return err == nil && now.State == "ready" && now.HostIfIndex != ep.HostIfIndex, fmt.Sprintf("%+v %v", now, err)
	})
	routed := time.Now()
	close(quit)
	wg.Wait()
	t.Logf("%d denied probes of server-1 from %v, while node-1's agent started (ready after %v) and made server-1 a new veth pair (ready %v later)",
		sent, start.Format("15:04:05.000"), ready.Sub(start).Round(time.Millisecond), routed.Sub(ready).Round(time.Millisecond))
	if len(connected) > 0 {
		slices.Sort(connected)
		t.Errorf("%d denied probes connected to server-1 while its veth pair was made again:\n%s", len(connected), strings.Join(connected, "\n"))
	}
	r.waitEnforced(t, 30*time.Second)
	checkPolicyMapsExact(t, c, "node-1")
}

// testRestartUnderProbes takes node-1's agent down with down, keeps it
// down for a full round of probes and starts it again, and checks that
// throughout no allowed probe failed or needed a retransmitted SYN, and no
// denied probe connected; and that the restarted agent, with its policy
// maps pinned and restored, wrote nothing into them
// (cellium_policy_map_writes_total stays 0 once its policy tables are
// computed, reconciled and pruned), and the other agent nothing either.
func testRestartUnderProbes(t *testing.T, c *devclustertest.Cluster, r *restartProbes, down func(node string)) {
	writes2 := policyMapWrites(t, c.Node("node-2"))
	start := time.Now()
	r.start()
	r.waitRounds(t, 1)
	down("node-1")
	stopped := time.Now()
	// A round begun and ended while the agent is down.
	r.waitRounds(t, 2)
	downFor := time.Now()
	ready, settled, bad, rounds, probes := startSettled(t, c, r, 2)
	t.Logf("%d probes in %d rounds over %v: agent down after %v, down for %v (%v of it probed), ready %v after its start, policy maps settled %v later",
		probes, rounds, time.Since(start).Round(time.Millisecond), stopped.Sub(start).Round(time.Millisecond),
		ready.Sub(stopped).Round(time.Millisecond), downFor.Sub(stopped).Round(time.Millisecond),
		ready.Sub(downFor).Round(time.Millisecond), settled.Sub(ready).Round(time.Millisecond))
	if len(bad) > 0 {
		t.Errorf("%d probes disagreed with the policy across node-1's restart:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if w := policyMapWrites(t, c.Node("node-1")); w != 0 {
		t.Errorf("node-1's restarted agent made %v policy map writes, want 0 (nothing changed)", w)
	}
	if w := policyMapWrites(t, c.Node("node-2")) - writes2; w != 0 {
		t.Errorf("node-2's agent made %v policy map writes while node-1's restarted, want 0", w)
	}
	checkPolicyMapsExact(t, c, "node-1")
}

// startSettled starts node-1's agent, waits until its policy maps settle
// and the probes make n more rounds, and stops them: when the agent was
// ready and settled, and what stop says.
func startSettled(t *testing.T, c *devclustertest.Cluster, r *restartProbes, n int) (ready, settled time.Time, bad []string, rounds, probes int) {
	c.StartAgent("node-1")
	ready = time.Now()
	waitPolicyMapsSettled(t, c, "node-1")
	settled = time.Now()
	r.waitRounds(t, n)
	bad, rounds, probes = r.stop()
	return
}

// testKillDuringConvergence restarts node-1's agent with a fault point
// that kills it (SIGKILL) right after its first policy map write, writes
// changedPolicies, and starts the agent again once the fault point has
// killed it, with half the change in its maps. Probes run throughout:
// the pairs the change does not concern must never disagree with the
// policy. Once node-1's agent has settled, its maps must hold exactly
// what its tables, computed afresh at its start, want (no allow the
// change removed left behind, none it added missing), and every pair
// must be as changedPolicies say.
func testKillDuringConvergence(t *testing.T, c *devclustertest.Cluster, r *restartProbes) {
	c.StopAgent("node-1")
	c.StartAgent("node-1", "--policy-map-test-crash-after=1")
	waitPolicyMapsSettled(t, c, "node-1")
	if w := policyMapWrites(t, c.Node("node-1")); w != 0 {
		t.Fatalf("node-1's restarted agent made %v policy map writes before the change, want 0", w)
	}
	r.allowed = unchanged(restartAllowed, changedAllowed)
	start := time.Now()
	r.start()
	r.waitRounds(t, 1)
	c.WriteManifest("restart-policies.yaml", changedPolicies)
	written := time.Now()
	c.WaitAgentExit("node-1")
	crashed := time.Now()
	if log, err := os.ReadFile(c.Node("node-1").Log()); err != nil || !strings.Contains(string(log), "Test fault point: killing the agent after a policy map write") {
		t.Fatalf("node-1's agent exited, but not at the fault point (%v); the end of its log:\n%s", err, tailLines(string(log), 20))
	}
	r.waitRounds(t, 1)
	ready, settled, bad, rounds, probes := startSettled(t, c, r, 1)
	writes := policyMapWrites(t, c.Node("node-1"))
	t.Logf("%d probes in %d rounds over %v: node-1's agent killed %v after the change was written, ready %v after, its maps settled %v later with %v writes",
		probes, rounds, time.Since(start).Round(time.Millisecond), crashed.Sub(written).Round(time.Millisecond),
		ready.Sub(crashed).Round(time.Millisecond), settled.Sub(ready).Round(time.Millisecond), writes)
	if len(bad) > 0 {
		t.Errorf("%d probes of pairs the change does not concern disagreed with the policy across node-1's crash:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	// The fault point killed the agent after one write of a change that
	// needs more: the restarted agent wrote the rest.
	if writes == 0 {
		t.Errorf("node-1's agent restarted after its crash made no policy map writes: the crash did not interrupt the change")
	}
	checkPolicyMapsExact(t, c, "node-1")
	waitPolicyMapsSettled(t, c, "node-2")
	r.allowed = only(changedAllowed)
	if bad := r.round(); len(bad) > 0 {
		t.Errorf("%d probes disagree with the changed policy once both agents settled:\n%s", len(bad), strings.Join(bad, "\n"))
	}
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// verdicts say whether a probe from, to, port must connect (allow), and
// whether it is checked at all.
type verdicts func(from, to string, port uint16) (allow, checked bool)

// only checks every pair against allowed.
func only(allowed func(from, to string, port uint16) bool) verdicts {
	return func(from, to string, port uint16) (bool, bool) { return allowed(from, to, port), true }
}

// unchanged checks the pairs that before and after agree on, while the
// policy goes from one to the other.
func unchanged(before, after func(from, to string, port uint16) bool) verdicts {
	return func(from, to string, port uint16) (bool, bool) {
		b := before(from, to, port)
		return b, b == after(from, to, port)
	}
}

// restartProbes probes every pair of pods on ports 80 and 81, each
// source pod's probes at once, round after round.
type restartProbes struct {
	pods    []devcluster.Pod
	probers []*devclustertest.Prober
	// allowed is the policy the probes are checked against; set it only
	// while they are stopped.
	allowed verdicts

	mu sync.Mutex
	// done are the rounds each prober finished, base those it had
	// finished at start.
	done   []int
	base   []int
	bad    []string
	probes int
	wake   chan struct{}
	quit   chan struct{}
	wg     sync.WaitGroup
}

func newRestartProbes(c *devclustertest.Cluster, pods []devcluster.Pod, allowed verdicts) *restartProbes {
	r := &restartProbes{pods: pods, allowed: allowed, done: make([]int, len(pods)), wake: make(chan struct{})}
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
	var allowed, checked []bool
	for _, to := range r.pods {
		if to.Name == from.Name {
			continue
		}
		for _, port := range []uint16{80, 81} {
			a, c := r.allowed(from.Name, to.Name, port)
			timeout := restartDeniedTimeout
			if a {
				timeout = restartAllowedTimeout
			}
			probes = append(probes, devclustertest.Probe{Protocol: devclustertest.TCP, To: netip.AddrPortFrom(to.IPv4, port), Timeout: timeout})
			allowed, checked = append(allowed, a), append(checked, c)
		}
	}
	at := time.Now().Format("15:04:05.000")
	var bad []string
	for k, res := range r.probers[i].Run(probes) {
		what := fmt.Sprintf("%s %s -> %s", at, from.Name, probes[k].To)
		switch {
		case !checked[k]:
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

// waitEnforced waits until one round of probes agrees with the policy in
// full.
func (r *restartProbes) waitEnforced(t *testing.T, timeout time.Duration) {
	t.Helper()
	polltest.Until(t, "every pair as the policy says in one round of probes", timeout, 0, func() (bool, string) {
		bad := r.round()
		return len(bad) == 0, "\n" + strings.Join(bad, "\n")
	})
}

// start probes from every pod, round after round, until stop.
func (r *restartProbes) start() {
	r.quit = make(chan struct{})
	r.probes, r.bad, r.base = 0, nil, slices.Clone(r.done)
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
	rounds = r.done[0] - r.base[0]
	for i := range r.done {
		rounds = min(rounds, r.done[i]-r.base[i])
	}
	return r.bad, rounds, r.probes
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

// checkPolicyMapsExact checks that node's pinned policy trie holds exactly
// the keys, with their cookies, of the rows of its agent's table
// "policy-entries", and its enforcement map exactly the rows of
// "policy-enforcement": nothing stale, nothing missing. The agent computes
// its tables afresh at its start, from the policies, identities and
// endpoints, never from the maps.
func checkPolicyMapsExact(t *testing.T, c *devclustertest.Cluster, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := c.Cluster.Client(node)
	if err != nil {
		t.Fatal(err)
	}
	maps, err := cl.Maps(ctx)
	if err != nil {
		t.Fatalf("%s's maps: %v", node, err)
	}
	pinned := func(name string) *ebpf.Map {
		t.Helper()
		for _, m := range maps {
			if filepath.Base(m.PinPath) == name {
				em, err := ebpf.LoadPinnedMap(m.PinPath, &ebpf.LoadPinOptions{ReadOnly: true})
				if err != nil {
					t.Fatalf("%s's map %s: %v", node, m.PinPath, err)
				}
				t.Cleanup(func() { em.Close() })
				return em
			}
		}
		t.Fatalf("%s's agent has no map %s", node, name)
		return nil
	}

	want := map[policymap.Key]uint32{}
	for _, raw := range tableObjects(ctx, t, cl, "policy-entries") {
		var e struct {
			Key struct {
				EndpointID, Port, EndPort uint16
				Direction, Protocol       uint8
				Identity                  uint32
			}
			Policies []string
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("policy-entries row %s: %v", raw, err)
		}
		dir := policymap.Ingress
		if e.Key.Direction == 1 {
			dir = policymap.Egress
		}
		keys, err := policymap.KeysOf(policymap.Allow{EndpointID: e.Key.EndpointID, Direction: dir, Identity: e.Key.Identity,
			Proto: e.Key.Protocol, Port: e.Key.Port, EndPort: e.Key.EndPort})
		if err != nil {
			t.Fatalf("policy-entries row %s: %v", raw, err)
		}
		for _, k := range keys {
			want[k] = policymap.Cookie(e.Policies)
		}
	}
	got := map[policymap.Key]uint32{}
	var k policymap.Key
	var v policymap.Value
	it := pinned(policymap.MapName).Iterate()
	for it.Next(&k, &v) {
		got[k] = v.Cookie
	}
	if err := it.Err(); err != nil {
		t.Fatalf("%s's policy trie: %v", node, err)
	}
	if diff := mapDiff(want, got, func(k policymap.Key) string { return k.String() }); diff != "" {
		t.Errorf("%s's policy trie is not what its policy-entries table wants (%d keys wanted, %d held):\n%s", node, len(want), len(got), diff)
	}

	wantEnf := map[uint32]policymap.Enforcement{}
	for _, raw := range tableObjects(ctx, t, cl, "policy-enforcement") {
		var e struct {
			EndpointID      uint16
			Ingress, Egress bool
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("policy-enforcement row %s: %v", raw, err)
		}
		var f policymap.Enforcement
		if e.Ingress {
			f.Flags |= policymap.FlagIngress
		}
		if e.Egress {
			f.Flags |= policymap.FlagEgress
		}
		wantEnf[uint32(e.EndpointID)] = f
	}
	gotEnf := map[uint32]policymap.Enforcement{}
	var id uint32
	var f policymap.Enforcement
	it = pinned(policymap.EnforcementMapName).Iterate()
	for it.Next(&id, &f) {
		gotEnf[id] = f
	}
	if err := it.Err(); err != nil {
		t.Fatalf("%s's enforcement map: %v", node, err)
	}
	if diff := mapDiff(wantEnf, gotEnf, func(id uint32) string { return fmt.Sprintf("endpoint %d", id) }); diff != "" {
		t.Errorf("%s's enforcement map is not what its policy-enforcement table wants:\n%s", node, diff)
	}
	t.Logf("%s's policy maps hold exactly its tables: %d trie keys, %d enforcement rows", node, len(got), len(gotEnf))
}

// tableObjects are the rows of one of the agent's tables, as JSON.
func tableObjects(ctx context.Context, t *testing.T, cl *client.Client, table string) apiv1.TableObjects {
	t.Helper()
	objs, err := cl.TableObjects(ctx, table, client.TableQuery{})
	if err != nil {
		t.Fatalf("table %s: %v", table, err)
	}
	return objs
}

// mapDiff says how got differs from want, one line per key; "" if not.
func mapDiff[K comparable, V comparable](want, got map[K]V, name func(K) string) string {
	var lines []string
	for k, w := range want {
		switch g, ok := got[k]; {
		case !ok:
			lines = append(lines, fmt.Sprintf("missing: %s = %v", name(k), w))
		case g != w:
			lines = append(lines, fmt.Sprintf("differs: %s = %v, want %v", name(k), g, w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("stale: %s = %v", name(k), g))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
