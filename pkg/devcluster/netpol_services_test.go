package devcluster_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestNetworkPolicyServices: network policy applies to the backend pod and
// its target port, after service translation, on a two-node dev-cluster
// with the real datapath. Two backends serve TCP 8080 and UDP 8053 (and
// port 80, for the controls), server on node-1 and far on node-2, each
// behind a Service (nodePortService) whose TCP port 80 targets 8080 and
// UDP port 53 targets 8053, with a ClusterIP and NodePorts. Clients: pods
// friend and stranger on node-1, friend2 on node-2, and the outside
// namespace (no node, the world).
//
//   - ClusterIP, socket load balancing: the pod's socket is sent to the
//     backend at connect(), so the packets carry the backend's address and
//     the target port. An ingress policy of the backends allowing only
//     role=friend on 8080 lets friend in through the ClusterIP (either
//     node) and drops stranger, with a Hubble drop POLICY_DENIED, ingress,
//     to the backend's 8080; one allowing only port 80 (the service's
//     port) lets friend in on the pod's port 80 but not through the
//     service. An egress policy of friend allowing app=server on 8080 lets
//     it reach server's ClusterIP and not far's; one allowing the
//     ClusterIP's address on port 80 allows nothing through it.
//   - NodePort from outside: a local backend sees the client's address
//     (identity world); a backend on the other node sees the address of
//     the node that translated the connection (SNAT; identity remote-node
//     there). So an ipBlock of the client admits it to local backends
//     only, an ipBlock of node-1's address admits node-1's NodePort to the
//     remote backend only, and a policy allowing only pods admits no
//     NodePort client from outside.
//
// Each step is checked by probes that must come to the expected answer
// (retried for the maps to be written), then by the Hubble flows of the
// step: drops with their identities, and an allow naming its policy.
func TestNetworkPolicyServices(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2})
	server := c.AddPod("node-1", "server", map[string]string{"app": "server"})
	far := c.AddPod("node-2", "far", map[string]string{"app": "far"})
	friend := c.AddPod("node-1", "friend", map[string]string{"role": "friend"})
	stranger := c.AddPod("node-1", "stranger", map[string]string{"role": "stranger"})
	friend2 := c.AddPod("node-2", "friend2", map[string]string{"role": "friend"})
	out := c.AddOutside()
	n1, n2 := c.Node("node-1"), c.Node("node-2")
	for _, b := range []string{"server", "far"} {
		c.ServeProbes(b, 80, 8080, 8053)
	}
	const vip1, vip2 = "10.96.0.81", "10.96.0.82"
	c.WriteManifest("server.yaml", nodePortService("server", vip1, 30181, 30182, server.IPv4, "node-1"))
	c.WriteManifest("far.yaml", nodePortService("far", vip2, 30191, 30192, far.IPv4, "node-2"))
	for _, n := range []string{"node-1", "node-2"} {
		c.WaitService(n, "default", "server")
		c.WaitService(n, "default", "far")
	}
	probers := map[string]*devclustertest.Prober{
		"friend": c.Prober("friend"), "stranger": c.Prober("stranger"), "friend2": c.Prober("friend2"),
		"outside": c.ProberAt(devclustertest.Where{NetNS: out.NetNS}),
	}
	svc1, svc2 := netip.MustParseAddr(vip1), netip.MustParseAddr(vip2)
	at := netip.AddrPortFrom
	const tcp, udp = devclustertest.TCP, devclustertest.UDP
	// The backends' policy selects both.
	const backends = `
  podSelector:
    matchExpressions: [{key: app, operator: In, values: [server, far]}]`
	ports := func(tcp, udp int) string {
		return fmt.Sprintf(`
    ports: [{protocol: TCP, port: %d}, {protocol: UDP, port: %d}]`, tcp, udp)
	}
	steps := []policySvcStep{{
		name: "ingress allows role=friend on the target port",
		policy: `
metadata: {name: backends-from-friend, namespace: default}
spec:` + backends + `
  ingress:
  - from: [{podSelector: {matchLabels: {role: friend}}}]` + ports(8080, 8053),
		probes: []policySvcProbe{
			{"friend", tcp, at(svc1, 80), true}, {"friend", udp, at(svc1, 53), true},
			{"stranger", tcp, at(svc1, 80), false}, {"stranger", udp, at(svc1, 53), false},
			// Across nodes: the client's node translates, the backend's
			// node decides on the client pod's identity.
			{"friend2", tcp, at(svc1, 80), true},
			{"friend", tcp, at(svc2, 80), true}, {"stranger", tcp, at(svc2, 80), false},
			// Only 8080 is allowed: the pod's own port 80 is not.
			{"friend", tcp, at(server.IPv4, 80), false},
		},
		drops: []policySvcFlow{
			{node: "node-1", src: stranger.IPv4, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
			{node: "node-2", src: stranger.IPv4, dst: at(far.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
		},
		allows: []policySvcFlow{
			{node: "node-1", src: friend.IPv4, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS, policy: "backends-from-friend"},
			{node: "node-1", src: friend2.IPv4, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS, policy: "backends-from-friend"},
		},
	}, {
		name: "ingress on the service's port is not on the target port",
		policy: `
metadata: {name: backends-port-80, namespace: default}
spec:` + backends + `
  ingress:
  - from: [{podSelector: {matchLabels: {role: friend}}}]` + ports(80, 53),
		probes: []policySvcProbe{
			{"friend", tcp, at(svc1, 80), false}, {"friend", udp, at(svc1, 53), false},
			{"friend", tcp, at(server.IPv4, 80), true},
		},
		drops: []policySvcFlow{
			{node: "node-1", src: friend.IPv4, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
		},
	}, {
		name: "egress to the backend's labels and target port through the ClusterIP",
		policy: `
metadata: {name: friend-to-server, namespace: default}
spec:
  podSelector: {matchLabels: {role: friend}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]` + ports(8080, 8053),
		probes: []policySvcProbe{
			{"friend", tcp, at(svc1, 80), true}, {"friend", udp, at(svc1, 53), true},
			{"friend2", tcp, at(svc1, 80), true},
			{"friend", tcp, at(svc2, 80), false}, {"friend", udp, at(svc2, 53), false},
			{"friend", tcp, at(server.IPv4, 80), false},
			// Not selected: unrestricted.
			{"stranger", tcp, at(svc2, 80), true},
		},
		drops: []policySvcFlow{
			{node: "node-1", src: friend.IPv4, dst: at(far.IPv4, 8080), dir: flow.TrafficDirection_EGRESS},
		},
		allows: []policySvcFlow{
			{node: "node-1", src: friend.IPv4, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_EGRESS, policy: "friend-to-server"},
		},
	}, {
		name: "egress to the ClusterIP's address and port is not to the backend",
		policy: `
metadata: {name: friend-to-vip, namespace: default}
spec:
  podSelector: {matchLabels: {role: friend}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: ` + vip1 + `/32}}]` + ports(80, 53) + `
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{protocol: TCP, port: 80}]`,
		probes: []policySvcProbe{
			{"friend", tcp, at(svc1, 80), false}, {"friend", udp, at(svc1, 53), false},
			{"friend", tcp, at(server.IPv4, 80), true},
		},
		drops: []policySvcFlow{
			{node: "node-1", src: friend.IPv4, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_EGRESS},
		},
	}, {
		name: "NodePort: an ipBlock of the outside client admits it to local backends",
		policy: `
metadata: {name: backends-from-outside, namespace: default}
spec:` + backends + `
  ingress:
  - from: [{ipBlock: {cidr: ` + out.IPv4.String() + `/32}}]` + ports(8080, 8053),
		probes: []policySvcProbe{
			{"outside", tcp, at(n1.IPv4, 30181), true}, {"outside", udp, at(n1.IPv4, 30182), true},
			{"outside", tcp, at(n2.IPv4, 30191), true},
			// The backend on node-2 sees node-1's address (SNAT).
			{"outside", tcp, at(n1.IPv4, 30191), false}, {"outside", udp, at(n1.IPv4, 30192), false},
			{"friend", tcp, at(svc1, 80), false},
		},
		drops: []policySvcFlow{
			{node: "node-2", src: n1.IPv4, srcIdentity: identity.RemoteNode, dst: at(far.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
		},
		allows: []policySvcFlow{
			{node: "node-1", src: out.IPv4, srcIdentity: identity.World, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS, policy: "backends-from-outside"},
		},
	}, {
		name: "NodePort: an ipBlock of node-1's address admits node-1's NodePort to the remote backend",
		policy: `
metadata: {name: backends-from-node-1, namespace: default}
spec:` + backends + `
  ingress:
  - from: [{ipBlock: {cidr: ` + n1.IPv4.String() + `/32}}]` + ports(8080, 8053),
		probes: []policySvcProbe{
			{"outside", tcp, at(n1.IPv4, 30191), true}, {"outside", udp, at(n1.IPv4, 30192), true},
			{"outside", tcp, at(n1.IPv4, 30181), false}, {"outside", tcp, at(n2.IPv4, 30191), false},
		},
		drops: []policySvcFlow{
			{node: "node-1", src: out.IPv4, srcIdentity: identity.World, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
			{node: "node-2", src: out.IPv4, srcIdentity: identity.World, dst: at(far.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
		},
	}, {
		name: "NodePort: a policy allowing only pods admits no client from outside",
		policy: `
metadata: {name: backends-from-pods, namespace: default}
spec:` + backends + `
  ingress:
  - from: [{namespaceSelector: {}}]` + ports(8080, 8053),
		probes: []policySvcProbe{
			{"outside", tcp, at(n1.IPv4, 30181), false}, {"outside", udp, at(n1.IPv4, 30182), false},
			{"outside", tcp, at(n1.IPv4, 30191), false}, {"outside", tcp, at(n2.IPv4, 30191), false},
			{"friend", tcp, at(svc1, 80), true}, {"friend", tcp, at(svc2, 80), true},
		},
		drops: []policySvcFlow{
			{node: "node-1", src: out.IPv4, srcIdentity: identity.World, dst: at(server.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
			{node: "node-2", src: n1.IPv4, srcIdentity: identity.RemoteNode, dst: at(far.IPv4, 8080), dir: flow.TrafficDirection_INGRESS},
		},
	}}

	start := time.Now()
	var prev string
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			name := policySvcName(st.policy)
			since := time.Now()
			before := map[string]uint64{}
			for _, n := range []string{"node-1", "node-2"} {
				before[n] = policyRevision(t, c, n)
			}
			if prev != "" {
				if err := c.RemoveManifest("policy." + prev + ".yaml"); err != nil {
					t.Fatal(err)
				}
			}
			c.WriteManifest("policy."+name+".yaml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy"+st.policy+"\n")
			prev = name
			for _, n := range []string{"node-1", "node-2"} {
				waitOnlyPolicy(t, c, n, "default/"+name, before[n])
			}
			runPolicySvcProbes(t, probers, st.probes)
			for _, d := range st.drops {
				d.find(t, c, since, flow.Verdict_DROPPED)
			}
			for _, a := range st.allows {
				a.find(t, c, since, flow.Verdict_FORWARDED)
			}
		})
	}
	t.Logf("%d steps in %v", len(steps), time.Since(start).Round(time.Millisecond))
}

type policySvcStep struct {
	name string
	// policy is a NetworkPolicy after its apiVersion and kind: it replaces
	// the previous step's.
	policy string
	probes []policySvcProbe
	// drops and allows are flows the step must have made.
	drops, allows []policySvcFlow
}

type policySvcProbe struct {
	from, proto string
	to          netip.AddrPort
	ok          bool
}

func policySvcName(policy string) string {
	_, after, _ := strings.Cut(policy, "{name: ")
	name, _, _ := strings.Cut(after, ",")
	return name
}

// policyRevision is node's policy revision.
func policyRevision(t *testing.T, c *devclustertest.Cluster, node string) uint64 {
	t.Helper()
	cl, err := c.Client(node)
	if err != nil {
		t.Fatal(err)
	}
	l, err := cl.Policies(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return l.Revision
}

// waitOnlyPolicy waits until node's agent has the policy key, applied
// at a revision after before and without error, and no other.
func waitOnlyPolicy(t *testing.T, c *devclustertest.Cluster, node, key string, before uint64) {
	t.Helper()
	cl, err := c.Client(node)
	if err != nil {
		t.Fatal(err)
	}
	polltest.Until(t, fmt.Sprintf("%s's agent with policy %s alone, applied after revision %d", node, key, before), 20*time.Second, 20*time.Millisecond, func() (bool, string) {
		l, err := cl.Policies(t.Context())
		if err != nil {
			return false, err.Error()
		}
		var names []string
		fresh := false
		for _, p := range l.Policies {
			names = append(names, p.Name)
			if p.Name == key && p.Error != "" {
				t.Fatalf("%s cannot apply %s: %s", node, key, p.Error)
			}
			fresh = fresh || (p.Name == key && p.Revision > before)
		}
		return slices.Equal(names, []string{key}) && fresh, fmt.Sprintf("policies %v at revision %d", names, l.Revision)
	})
}

// runPolicySvcProbes runs the probes, each prober's at once, again and
// again for those that differ from what they expect, until they all agree
// or 10s have passed; those that still differ fail the test. A denied
// probe takes its timeout, 1s.
func runPolicySvcProbes(t *testing.T, probers map[string]*devclustertest.Prober, probes []policySvcProbe) {
	t.Helper()
	todo := make([]int, len(probes))
	for i := range probes {
		todo[i] = i
	}
	errs := make([]string, len(probes))
	err := polltest.Wait("every probe as expected", 10*time.Second, 0, func() (bool, string) {
		by := map[string][]int{}
		for _, k := range todo {
			by[probes[k].from] = append(by[probes[k].from], k)
		}
		var mu sync.Mutex
		var next []int
		var wg sync.WaitGroup
		for from, list := range by {
			wg.Go(func() {
				req := make([]devclustertest.Probe, len(list))
				for i, k := range list {
					req[i] = devclustertest.Probe{Protocol: probes[k].proto, To: probes[k].to, Timeout: time.Second}
				}
				res := probers[from].Run(req)
				mu.Lock()
				defer mu.Unlock()
				for i, k := range list {
					errs[k] = res[i].Error
					if res[i].OK != probes[k].ok {
						next = append(next, k)
					}
				}
			})
		}
		wg.Wait()
		todo = next
		var differ []string
		for _, k := range todo {
			p, want := probes[k], "denied"
			if p.ok {
				want = "allowed"
			}
			differ = append(differ, fmt.Sprintf("%s -> %s/%s: want %s, got %q", p.from, p.to, p.proto, want, errs[k]))
		}
		return len(todo) == 0, strings.Join(differ, "; ")
	})
	if err != nil {
		t.Error(err)
	}
}

// policySvcFlow is a flow a step must have made: from src (of identity
// srcIdentity, when set) to dst over TCP, in direction at node; with
// policy, allowed by it.
type policySvcFlow struct {
	node        string
	src         netip.Addr
	srcIdentity identity.NumericIdentity
	dst         netip.AddrPort
	dir         flow.TrafficDirection
	policy      string
}

// find looks for the flow among node's Hubble flows since since with the
// verdict: a drop must say POLICY_DENIED, an allow must name the policy.
// The flows are written as the packets pass, but read through the agent's
// event ring: a few tries.
func (w policySvcFlow) find(t *testing.T, c *devclustertest.Cluster, since time.Time, verdict flow.Verdict) {
	t.Helper()
	err := polltest.Wait(fmt.Sprintf("a %s flow in %s's Hubble %s (identity %d) -> %s %s (policy %q)", verdict, w.node, w.src, w.srcIdentity, w.dst, w.dir, w.policy), 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		flows := hubbleFlows(t, c.Node(w.node), "--since", since.UTC().Format(time.RFC3339Nano), "--verdict", verdict.String(),
			"--from-ip", w.src.String(), "--to-ip", w.dst.Addr().String(), "--protocol", "tcp")
		var got []string
		for _, f := range flows {
			got = append(got, fmt.Sprintf("%s:%d(%d) -> %s:%d %s %s %s allowed by %v%v", f.GetIP().GetSource(), f.GetL4().GetTCP().GetSourcePort(),
				f.GetSource().GetIdentity(), f.GetIP().GetDestination(), f.GetL4().GetTCP().GetDestinationPort(), f.GetVerdict(),
				f.GetDropReasonDesc(), f.GetTrafficDirection(), f.GetIngressAllowedBy(), f.GetEgressAllowedBy()))
		}
		return slices.ContainsFunc(flows, w.matches), "its flows between them:\n" + strings.Join(got, "\n")
	})
	if err != nil {
		t.Error(err)
	}
}

func (w policySvcFlow) matches(f *flow.Flow) bool {
	if f.GetIP().GetSource() != w.src.String() || f.GetIP().GetDestination() != w.dst.Addr().String() ||
		f.GetL4().GetTCP().GetDestinationPort() != uint32(w.dst.Port()) || f.GetTrafficDirection() != w.dir {
		return false
	}
	if w.srcIdentity != 0 && f.GetSource().GetIdentity() != uint32(w.srcIdentity) {
		return false
	}
	if w.policy == "" {
		return f.GetVerdict() == flow.Verdict_DROPPED && f.GetDropReasonDesc() == flow.DropReason_POLICY_DENIED
	}
	by := f.GetIngressAllowedBy()
	if w.dir == flow.TrafficDirection_EGRESS {
		by = f.GetEgressAllowedBy()
	}
	return slices.ContainsFunc(by, func(p *flow.Policy) bool { return p.GetName() == w.policy && p.GetNamespace() == "default" })
}

// hubbleFlows is `agent observe -o json` with args against node's Hubble
// server.
func hubbleFlows(t *testing.T, n devcluster.Node, args ...string) []*flow.Flow {
	t.Helper()
	agent, _ := devclustertest.Binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	argv := append([]string{"observe", "-o", "json", "--hubble-listen-address", "unix://" + n.HubbleSocket()}, args...)
	out, err := exec.CommandContext(ctx, agent, argv...).Output()
	if err != nil {
		t.Fatalf("agent %v: %v\n%s", argv, err, out)
	}
	return parseFlows(out)
}

// parseFlows reads the flows of GetFlowsResponses in protobuf's JSON
// form, one a line (`hubble observe -o jsonpb`, `agent observe -o json`).
func parseFlows(out []byte) []*flow.Flow {
	var flows []*flow.Flow
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var resp observer.GetFlowsResponse
		if protojson.Unmarshal(sc.Bytes(), &resp) == nil && resp.GetFlow() != nil {
			flows = append(flows, resp.GetFlow())
		}
	}
	return flows
}
