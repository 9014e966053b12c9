package devcluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/netpolmodel"
)

// The upstream Kubernetes e2e network-policy model
// (test/e2e/network/netpol): namespaces x, y and z with pods a, b and c
// each (label pod=NAME), every pod serving TCP, UDP and SCTP on ports 80
// and 81 (container ports named serve-80-tcp and so on), the pods spread
// over two nodes. Each case of the upstream suite sets policies, and pod
// and namespace labels, step by step; after each step every pod probes
// every pod on every port and protocol (81 pairs, 6 probes each) and the
// truth table must equal the one package netpolmodel computes from the
// specification.
func TestNetworkPolicyTruthTable(t *testing.T) {
	start := time.Now()
	w := newNetpolWorld(t)
	for _, tc := range netpolCases {
		if w.broken {
			t.Fatalf("the cluster did not take a step's changes: no further case can run")
		}
		t.Run(tc.name, func(t *testing.T) {
			w.reset()
			for i, st := range tc.steps {
				w.apply(t, st)
				w.check(t, fmt.Sprintf("step %d (%s)", i+1, st.what))
			}
		})
	}
	t.Logf("%d cases, %d steps, %d probe rounds in %v", w.cases, w.steps, w.rounds, time.Since(start).Round(time.Millisecond))
}

// netpolPods: which node each pod is on. Pairs on one node and across
// nodes both occur in every namespace.
var netpolPods = []struct{ ns, name, node string }{
	{"x", "a", "node-1"}, {"x", "b", "node-2"}, {"x", "c", "node-1"},
	{"y", "a", "node-2"}, {"y", "b", "node-1"}, {"y", "c", "node-2"},
	{"z", "a", "node-1"}, {"z", "b", "node-2"}, {"z", "c", "node-1"},
}

var (
	netpolPorts     = []uint16{80, 81}
	netpolProtocols = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
)

// netpolStep changes the world: policies created or replaced (YAML, a
// template with {{ip "y/b"}} for a pod's address and {{cidr4 "x/b"}} for
// the /4 around it), policies deleted, and labels replaced.
type netpolStep struct {
	what      string
	policies  []string
	delete    []string // NAMESPACE/NAME, or "*" for every policy
	nsLabels  map[string]map[string]string
	podLabels map[string]map[string]string
}

type netpolCase struct {
	// name is the upstream test's.
	name  string
	steps []netpolStep
}

// netpolWorld is the cluster and what is applied to it.
type netpolWorld struct {
	t       *testing.T
	c       *devclustertest.Cluster
	nodes   []string
	pods    []netpolmodel.Pod
	probers map[string]*devclustertest.Prober
	// probes are the ports probed; SCTP only where the kernel has it.
	probes []netpolmodel.Port

	nsLabels  map[string]map[string]string
	podLabels map[string]map[string]string
	policies  map[string]networkingv1.NetworkPolicy // by NAMESPACE/NAME

	cases, steps, rounds int
	// broken: a step's changes did not reach the agents.
	broken bool
}

func baseNSLabels() map[string]map[string]string {
	return map[string]map[string]string{"x": {"ns": "x"}, "y": {"ns": "y"}, "z": {"ns": "z"}}
}

func newNetpolWorld(t *testing.T) *netpolWorld {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2})
	w := &netpolWorld{t: t, c: c, nodes: []string{"node-1", "node-2"}, probers: map[string]*devclustertest.Prober{},
		nsLabels: baseNSLabels(), podLabels: map[string]map[string]string{}, policies: map[string]networkingv1.NetworkPolicy{}}
	var ports []devcluster.ContainerPort
	var modelPorts []corev1.ContainerPort
	for _, port := range netpolPorts {
		for _, proto := range netpolProtocols {
			name := fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto)))
			ports = append(ports, devcluster.ContainerPort{Name: name, Port: port, Protocol: string(proto)})
			modelPorts = append(modelPorts, corev1.ContainerPort{Name: name, ContainerPort: int32(port), Protocol: proto})
		}
	}
	for ns, l := range w.nsLabels {
		w.writeNamespace(ns, l)
	}
	var noSCTP string
	for _, p := range netpolPods {
		ref := p.ns + "/" + p.name
		labels := map[string]string{"pod": p.name}
		pod := c.AddPodSpec(devcluster.PodSpec{Node: p.node, Namespace: p.ns, Name: p.name, Labels: labels, Ports: ports})
		if s := c.ServeProbes(ref, netpolPorts...); s.NoSCTP != "" {
			noSCTP = s.NoSCTP
		}
		w.probers[ref] = c.Prober(ref)
		w.podLabels[ref] = labels
		w.pods = append(w.pods, netpolmodel.Pod{Namespace: p.ns, Name: p.name, Labels: labels, IP: pod.IPv4, Ports: modelPorts})
	}
	for _, proto := range netpolProtocols {
		if proto == corev1.ProtocolSCTP && noSCTP != "" {
			t.Logf("SCTP is not probed: %s", noSCTP)
			continue
		}
		for _, port := range netpolPorts {
			w.probes = append(w.probes, netpolmodel.Port{Port: port, Protocol: proto})
		}
	}
	return w
}

func (w *netpolWorld) writeNamespace(ns string, labels map[string]string) {
	obj := corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}}
	obj.Name, obj.Labels = ns, labels
	w.writeJSON("namespace."+ns+".json", obj)
}

func (w *netpolWorld) writeJSON(name string, obj any) {
	b, err := json.Marshal(obj)
	if err != nil {
		w.t.Fatal(err)
	}
	w.c.WriteManifest(name, string(b))
}

func policyManifest(key string) string {
	ns, name, _ := strings.Cut(key, "/")
	return "netpol." + ns + "." + name + ".json"
}

// reset starts a case: no policies, every label as at the start. It is
// applied with the case's first step.
func (w *netpolWorld) reset() {
	w.cases++
	for key := range w.policies {
		if err := w.c.RemoveManifest(policyManifest(key)); err != nil {
			w.t.Fatal(err)
		}
		delete(w.policies, key)
	}
	for ns, l := range baseNSLabels() {
		if !maps.Equal(w.nsLabels[ns], l) {
			w.nsLabels[ns] = l
			w.writeNamespace(ns, l)
		}
	}
	for _, p := range netpolPods {
		ref, base := p.ns+"/"+p.name, map[string]string{"pod": p.name}
		if !maps.Equal(w.podLabels[ref], base) {
			w.c.SetPodLabels(ref, base)
			w.podLabels[ref] = base
		}
	}
}

func (w *netpolWorld) pod(ref string) netpolmodel.Pod {
	for _, p := range w.pods {
		if p.String() == ref {
			return p
		}
	}
	w.t.Fatalf("no pod %s", ref)
	return netpolmodel.Pod{}
}

// parsePolicy reads a step's policy: its template filled in, its YAML
// decoded.
func (w *netpolWorld) parsePolicy(t *testing.T, text string) networkingv1.NetworkPolicy {
	funcs := template.FuncMap{
		"ip": func(ref string) string { return w.pod(ref).IP.String() },
		"cidr4": func(ref string) string {
			p, _ := w.pod(ref).IP.Prefix(4)
			return p.String()
		},
	}
	tmpl, err := template.New("policy").Funcs(funcs).Parse(text)
	if err != nil {
		t.Fatalf("policy %s: %v", text, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, nil); err != nil {
		t.Fatalf("policy %s: %v", text, err)
	}
	var pol networkingv1.NetworkPolicy
	if err := yaml.UnmarshalStrict(b.Bytes(), &pol); err != nil {
		t.Fatalf("policy %s: %v", b.String(), err)
	}
	// YAML 1.1 reads a bare y as true: quote namespace y in the cases.
	if js, _ := json.Marshal(pol); pol.Namespace == "" || bytes.Contains(js, []byte(`":"true"`)) {
		t.Fatalf("policy %s: a namespace, and no value true (quote \"y\")", b.String())
	}
	pol.TypeMeta.APIVersion, pol.TypeMeta.Kind = "networking.k8s.io/v1", "NetworkPolicy"
	return pol
}

// apply makes st's changes and waits until every agent has them: the
// policies at a new revision, the pods' endpoints with their labels and
// identities, every node's ipcache with every pod's identity. What then
// remains asynchronous (computation, the maps) the probes' retries cover.
func (w *netpolWorld) apply(t *testing.T, st netpolStep) {
	w.steps++
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := map[string]uint64{}
	for _, n := range w.nodes {
		cl, _ := w.c.Client(n)
		l, err := cl.Policies(ctx)
		if err != nil {
			t.Fatal(err)
		}
		before[n] = l.Revision
	}
	changed := map[string]bool{}
	for _, key := range st.delete {
		for k := range w.policies {
			if key == "*" || key == k {
				if err := w.c.RemoveManifest(policyManifest(k)); err != nil {
					t.Fatal(err)
				}
				delete(w.policies, k)
			}
		}
	}
	for _, text := range st.policies {
		pol := w.parsePolicy(t, text)
		key := pol.Namespace + "/" + pol.Name
		w.policies[key], changed[key] = pol, true
		w.writeJSON(policyManifest(key), pol)
	}
	for ns, l := range st.nsLabels {
		w.nsLabels[ns] = l
		w.writeNamespace(ns, l)
	}
	var wg sync.WaitGroup
	for ref, l := range st.podLabels {
		w.podLabels[ref] = l
		wg.Go(func() { w.c.SetPodLabels(ref, l) })
	}
	wg.Wait()
	for i := range w.pods {
		w.pods[i].Labels = w.podLabels[w.pods[i].String()]
	}
	for _, n := range w.nodes {
		w.waitPolicies(ctx, t, n, before[n], changed)
	}
	w.waitIdentities(ctx, t)
}

// waitPolicies waits until node's agent has exactly the world's policies,
// those changed in this step at a revision after before.
func (w *netpolWorld) waitPolicies(ctx context.Context, t *testing.T, node string, before uint64, changed map[string]bool) {
	cl, _ := w.c.Client(node)
	want := slices.Sorted(maps.Keys(w.policies))
	var last string
	for {
		l, err := cl.Policies(ctx)
		if err == nil {
			var have []string
			fresh := true
			for _, p := range l.Policies {
				have = append(have, p.Name)
				if changed[p.Name] && p.Revision <= before {
					fresh = false
				}
				if changed[p.Name] && p.Error != "" {
					t.Errorf("%s's agent cannot apply policy %s: %s", node, p.Name, p.Error)
				}
			}
			slices.Sort(have)
			if slices.Equal(have, want) && fresh {
				return
			}
			last = fmt.Sprintf("policies %v (revision %d), want %v", have, l.Revision, want)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			w.broken = true
			t.Fatalf("%s's agent: %s", node, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitIdentities waits until each pod's endpoint has its pod's and its
// namespace's labels and an identity, and every node's ipcache maps the
// pod's address to that identity in its map.
func (w *netpolWorld) waitIdentities(ctx context.Context, t *testing.T) {
	clients := map[string]*client.Client{}
	for _, n := range w.nodes {
		clients[n], _ = w.c.Client(n)
	}
	var last string
	for {
		done := true
		for _, p := range w.pods {
			dp := w.c.Pod(p.String())
			ep, err := clients[dp.Node].Endpoint(ctx, client.ContainerEndpointID(dp.ContainerID))
			switch {
			case err != nil:
				done, last = false, err.Error()
			case !maps.Equal(ep.Labels, p.Labels) || !maps.Equal(ep.NamespaceLabels, w.nsLabels[p.Namespace]) || ep.IdentityPending:
				done, last = false, fmt.Sprintf("endpoint of %s: labels %v, namespace labels %v, identity %d (pending %v)", p, ep.Labels, ep.NamespaceLabels, ep.Identity, ep.IdentityPending)
			default:
				for _, n := range w.nodes {
					e, err := clients[n].IPCacheLookup(ctx, p.IP.String())
					if err != nil || e.Identity != ep.Identity || !strings.HasPrefix(e.Status, "Done") {
						done, last = false, fmt.Sprintf("%s's ipcache has %s as %+v (%v), want identity %d", n, p, e, err, ep.Identity)
					}
				}
			}
			if !done {
				break
			}
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			w.broken = true
			t.Fatalf("identities: %s", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Probe timeouts: the first round's, and the retries' of the pairs that
// differ from the model, until the deadline.
const (
	netpolFirstTimeout = time.Second
	netpolRetryTimeout = 2 * time.Second
	netpolDeadline     = 10 * time.Second
)

// check probes every pair on every port and compares with the model. The
// pairs that differ are probed again, until they agree or the deadline:
// what remains asynchronous after apply, and a connection slow on a busy
// machine, get their time; a difference that stays fails the test.
func (w *netpolWorld) check(t *testing.T, step string) {
	model := netpolmodel.Cluster{NamespaceLabels: w.nsLabels, Pods: w.pods, Policies: slices.Collect(maps.Values(w.policies))}
	want := make([]netpolmodel.Matrix, len(w.probes))
	got := make([]netpolmodel.Matrix, len(w.probes))
	names := make([]string, len(w.pods))
	for i, p := range w.pods {
		names[i] = p.String()
	}
	type cell struct{ port, from, to int }
	var todo []cell
	for k, port := range w.probes {
		m, err := model.Expect(port)
		if err != nil {
			t.Fatalf("%s: the model: %v", step, err)
		}
		want[k], got[k] = m, netpolmodel.NewMatrix(port, names)
		for i := range w.pods {
			for j := range w.pods {
				todo = append(todo, cell{k, i, j})
			}
		}
	}
	start := time.Now()
	lastErr := map[cell]string{}
	for round := 0; len(todo) > 0; round++ {
		timeout := netpolFirstTimeout
		if round > 0 {
			if time.Since(start) > netpolDeadline {
				break
			}
			timeout = netpolRetryTimeout
		}
		w.rounds++
		// Each source pod's prober runs its probes at once, every prober
		// at the same time.
		bySource := map[int][]cell{}
		for _, c := range todo {
			bySource[c.from] = append(bySource[c.from], c)
		}
		var mu sync.Mutex
		var next []cell
		var wg sync.WaitGroup
		for from, cells := range bySource {
			wg.Go(func() {
				probes := make([]devclustertest.Probe, len(cells))
				for i, c := range cells {
					port := w.probes[c.port]
					probes[i] = devclustertest.Probe{Protocol: string(port.Protocol), To: netip.AddrPortFrom(w.pods[c.to].IP, port.Port), Timeout: timeout}
				}
				res := w.probers[w.pods[from].String()].Run(probes)
				mu.Lock()
				defer mu.Unlock()
				for i, c := range cells {
					got[c.port].Allowed[c.from][c.to] = res[i].OK
					lastErr[c] = res[i].Error
					if res[i].OK != want[c.port].Allowed[c.from][c.to] {
						next = append(next, c)
					}
				}
			})
		}
		wg.Wait()
		if round > 0 && len(next) < len(todo) {
			t.Logf("%s: %d probes agreed with the model only after %v", step, len(todo)-len(next), time.Since(start).Round(time.Millisecond))
		}
		todo = next
	}
	for k := range w.probes {
		if want[k].Differences(got[k]) > 0 {
			var errs []string
			for c, e := range lastErr {
				if c.port == k && e != "" && want[k].Allowed[c.from][c.to] {
					errs = append(errs, fmt.Sprintf("%s -> %s: %s", names[c.from], names[c.to], e))
				}
			}
			slices.Sort(errs)
			t.Errorf("%s: %s\n%s", step, want[k].Diff(got[k]), strings.Join(errs, "\n"))
		}
	}
}
