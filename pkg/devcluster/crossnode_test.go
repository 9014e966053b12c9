package devcluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/polltest"
)

// The routes the agent owns carry this protocol (cells/routing).
const agentRouteProtocol = 201

// crossNode is one cluster's pods for the cross-node tests: client on
// node-1, server on node-2, backend (of the Service web) on node-3.
type crossNode struct {
	c                       *devclustertest.Cluster
	client, server, backend devcluster.Pod
	vip                     netip.AddrPort
}

func newCrossNode(t *testing.T, mode string) *crossNode {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 3, RoutingMode: mode})
	x := &crossNode{c: c, vip: netip.MustParseAddrPort("10.96.0.60:80")}
	x.client = c.AddPod("node-1", "client", map[string]string{"app": "client"})
	x.server = c.AddPod("node-2", "server", map[string]string{"app": "server"})
	x.backend = c.AddPod("node-3", "backend", map[string]string{"app": "web"})
	c.ServeTCP("server", 8080)
	c.ServeTCP("backend", 8080)
	c.WriteManifest("web.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: %s
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [%s]
  conditions: {ready: true}
`, x.vip.Addr(), x.backend.IPv4))
	c.WaitService("node-1", "default", "web")
	return x
}

// reaches checks ping (both families) and TCP from the client to the
// server on another node, the server seeing the client's own address.
func (x *crossNode) reaches(t *testing.T, when string) {
	t.Helper()
	for _, dst := range []netip.Addr{x.server.IPv4, x.server.IPv6} {
		if err := x.c.Ping("client", dst); err != nil {
			t.Errorf("%s: ping client (node-1) -> server %s (node-2): %v", when, dst, err)
		}
	}
	for _, dst := range []netip.Addr{x.server.IPv4, x.server.IPv6} {
		r := x.c.DialTCP("client", netip.AddrPortFrom(dst, 8080))
		if r.Error != "" || r.Reply.Pod != "server" || r.Reply.Remote.Addr() != r.Local.Addr() {
			t.Errorf("%s: TCP client (node-1) -> server %s (node-2): %+v, want the server's reply seeing the client's address", when, dst, r)
		}
	}
}

// viaService checks that the client reaches the backend on node-3 through
// the ClusterIP (node-1's socket load balancing, then the route to node-3).
func (x *crossNode) viaService(t *testing.T) {
	t.Helper()
	r := x.c.DialTCP("client", x.vip)
	if r.Error != "" || r.Reply.Pod != "backend" || r.Peer != x.vip || r.Reply.Local != netip.AddrPortFrom(x.backend.IPv4, 8080) {
		t.Errorf("TCP client (node-1) -> %s -> backend (node-3): %+v", x.vip, r)
	}
}

func TestCrossNodeNative(t *testing.T) {
	x := newCrossNode(t, "native")
	x.reaches(t, "native")
	x.viaService(t)
	if routes := agentRoutes(t, x.c.Node("node-1").NetNS); !slices.ContainsFunc(routes, func(r string) bool {
		return strings.HasPrefix(r, x.c.Node("node-2").PodCIDRs[0].String()+" via "+x.c.Node("node-2").IPv4.String())
	}) {
		t.Errorf("node-1's routes %v: none to node-2's pods via node-2's address", routes)
	}
}

// TestCrossNodeTunnel: across nodes through VXLAN, pods reach each other
// and a Service's backend; the receiving node's flows name the sender by
// its identity and labels; traffic keeps flowing while an agent is dead;
// a restarted agent rewrites no route; a node that leaves takes its routes
// away from the others.
func TestCrossNodeTunnel(t *testing.T) {
	x := newCrossNode(t, "tunnel")
	c := x.c
	x.reaches(t, "tunnel")
	x.viaService(t)

	t.Run("flows on the receiving node name the sender", func(t *testing.T) {
		cl, err := c.Client("node-1")
		if err != nil {
			t.Fatal(err)
		}
		eps, err := cl.Endpoints(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var clientID uint32
		for _, ep := range eps {
			if ep.PodName == "client" {
				clientID = ep.Identity
			}
		}
		if clientID < 256 || clientID > 65535 {
			t.Fatalf("client's identity %d: want a cluster identity (kvstore)", clientID)
		}
		polltest.Until(t, fmt.Sprintf("a flow in node-2's from the client with its identity %d, labels and name", clientID), 30*time.Second, 200*time.Millisecond, func() (bool, string) {
			x.c.Ping("client", x.server.IPv4)
			flows, out := observe(t, c.Node("node-2"), "--from-identity", fmt.Sprint(clientID), "--to-pod", "default/server")
			return slices.ContainsFunc(flows, func(f flowJSON) bool {
				return f.Source.Identity == clientID && slices.Contains(f.Source.Labels, "k8s:app=client") &&
					f.Source.PodName == "client" && f.Destination.PodName == "server"
			}), "node-2's flows:\n" + out
		})
	})

	t.Run("traffic flows while an agent is dead", func(t *testing.T) {
		c.KillAgent("node-2")
		x.reaches(t, "node-2's agent killed")
		c.StartAgent("node-2")
		x.reaches(t, "node-2's agent back")
	})

	t.Run("a restart rewrites no route", func(t *testing.T) {
		changes := watchRoutes(t, c.Node("node-1").NetNS)
		c.RestartAgent("node-1")
		x.reaches(t, "node-1's agent restarted")
		if got := changes(); len(got) > 0 {
			t.Errorf("route changes in node-1 while its agent restarted: %v", got)
		}
	})

	t.Run("a node that leaves takes its routes", func(t *testing.T) {
		gone := c.Node("node-3").PodCIDRs[0].String()
		if !slices.ContainsFunc(agentRoutes(t, c.Node("node-1").NetNS), func(r string) bool { return strings.HasPrefix(r, gone) }) {
			t.Fatalf("node-1 has no route to node-3's pods %s to begin with", gone)
		}
		c.RemoveNode("node-3")
		polltest.Until(t, fmt.Sprintf("node-1's route to node-3's pods %s gone after node-3 left", gone), 30*time.Second, 100*time.Millisecond, func() (bool, string) {
			routes := agentRoutes(t, c.Node("node-1").NetNS)
			return !slices.ContainsFunc(routes, func(r string) bool { return strings.HasPrefix(r, gone) }), fmt.Sprintf("node-1's routes %v", routes)
		})
		x.reaches(t, "after node-3 left")
	})
}

// agentRoutes are the agent's routes (both families) in a node's
// namespace, as "prefix via gateway".
func agentRoutes(t *testing.T, nsPath string) []string {
	t.Helper()
	h := nlHandle(t, nsPath)
	defer h.Close()
	var out []string
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := h.RouteListFiltered(fam, &netlink.Route{Protocol: agentRouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			out = append(out, fmt.Sprintf("%s via %s", r.Dst, r.Gw))
		}
	}
	return out
}

func nlHandle(t *testing.T, nsPath string) *netlink.Handle {
	t.Helper()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// watchRoutes records the changes of the agent's routes in a namespace
// from now; the function it returns stops and lists them.
func watchRoutes(t *testing.T, nsPath string) func() []string {
	t.Helper()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	updates, done := make(chan netlink.RouteUpdate, 1000), make(chan struct{})
	if err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		defer ns.Close()
		close(done)
		var out []string
		for u := range updates {
			if u.Protocol == agentRouteProtocol {
				out = append(out, fmt.Sprintf("%d %s via %s", u.Type, u.Dst, u.Gw))
			}
		}
		return out
	}
}

type flowJSON struct {
	Source, Destination struct {
		Identity uint32
		PodName  string
		Labels   []string
	}
}

// observe is `agent observe -o json --last 1000` with filters against a
// node's Hubble server.
func observe(t *testing.T, n devcluster.Node, filters ...string) ([]flowJSON, string) {
	t.Helper()
	agent, _ := devclustertest.Binaries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	args := append([]string{"observe", "-o", "json", "--last", "1000", "--hubble-listen-address", "unix://" + n.HubbleSocket()}, filters...)
	out, err := exec.CommandContext(ctx, agent, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("agent %v: %v\n%s", args, err, out)
	}
	var flows []flowJSON
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var l struct{ Flow *flowJSON }
		if json.Unmarshal([]byte(line), &l) == nil && l.Flow != nil {
			flows = append(flows, *l.Flow)
		}
	}
	return flows, string(out)
}

// BenchmarkCrossNodeThroughput: TCP from a pod on node-1 to a pod on
// node-2, in each routing mode, beside TCP from node-1 to node-2 over the
// same veths and bridge (no pod, no tunnel). Prints, per mode,
// `crossnode-bench mode=... pod_gbps=... host_gbps=... ratio=...`.
func BenchmarkCrossNodeThroughput(b *testing.B) {
	const d = 3 * time.Second
	for _, mode := range []string{"tunnel", "native"} {
		c := devclustertest.Start(b, devcluster.Options{Nodes: 2, RoutingMode: mode})
		c.AddPod("node-1", "a", nil)
		pb := c.AddPod("node-2", "b", nil)
		c.Sink(devclustertest.Where{Pod: "b"}, 5001)
		c.Sink(devclustertest.Where{Node: "node-2"}, 5002)
		b.ResetTimer()
		pod := c.Send(devclustertest.Where{Pod: "a"}, netip.AddrPortFrom(pb.IPv4, 5001), d)
		host := c.Send(devclustertest.Where{Node: "node-1"}, netip.AddrPortFrom(c.Node("node-2").IPv4, 5002), d)
		b.StopTimer()
		fmt.Printf("crossnode-bench mode=%s pod_gbps=%.2f host_gbps=%.2f ratio=%.2f\n",
			mode, pod.BitsPerSecond()/1e9, host.BitsPerSecond()/1e9, pod.BitsPerSecond()/host.BitsPerSecond())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := c.Down(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}
