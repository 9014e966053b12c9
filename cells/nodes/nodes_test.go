package nodes_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/internal/kvsync/kvsynctest"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/nettest"
)

type agent struct {
	db  *statedb.DB
	tbl statedb.Table[*nodes.Node]
	k8s *k8sclient.Fake
	kv  kvstore.Client
	h   *hive.Hive
	hs  statedb.Table[*health.Status]
	m   kvsynctest.Metrics
	// devs is the devices table.
	devs statedb.Table[*devices.Device]
	// eps is the endpoints table.
	eps statedb.RWTable[*endpointmanager.Endpoint]
}

type opts struct {
	name, podCIDR string
	nodeIP        []string
	netns         string
	k8s           []runtime.Object
	etcd          string
}

// annotationOut contributes an annotation, as the routing cell does.
type annotationOut struct {
	cell.Out
	A nodes.Annotation `group:"node-annotations"`
}

func start(t *testing.T, o opts) *agent {
	t.Helper()
	a := &agent{}
	a.h = celltest.New(daemon.Cell, ipam.Cell, devices.Cell, kvstore.Cell, k8sclienttest.Cell(o.k8s...), nodes.Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Provide(func() annotationOut { return annotationOut{A: nodes.Annotation{Key: "example.com/test", Value: "yes"}} }),
		cell.Invoke(func(db *statedb.DB, tbl statedb.Table[*nodes.Node], cs *k8sclient.Fake, kv kvstore.Client, hs statedb.Table[*health.Status], m kvsynctest.Metrics, devs statedb.Table[*devices.Device], eps statedb.RWTable[*endpointmanager.Endpoint]) {
			a.db, a.tbl, a.k8s, a.kv, a.hs, a.m, a.devs, a.eps = db, tbl, cs, kv, hs, m, devs, eps
		}))
	dir := t.TempDir()
	hive.AddConfigOverride(a.h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), o.name
	})
	hive.AddConfigOverride(a.h, func(c *ipam.Config) { c.PodCIDR = []string{o.podCIDR} })
	hive.AddConfigOverride(a.h, func(c *nodes.Config) { c.NodeIP = o.nodeIP })
	hive.AddConfigOverride(a.h, func(c *devices.Config) { c.DevicesNetns = o.netns })
	if o.etcd != "" {
		hive.AddConfigOverride(a.h, func(c *kvstore.Config) {
			c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + o.etcd}, "nodes"
		})
	}
	celltest.Start(t, a.h)
	return a
}

// wait waits, on the table's watch channel, until ok holds for the rows.
func (a *agent) wait(t *testing.T, what string, ok func(map[string]*nodes.Node) bool) map[string]*nodes.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		all, watch := a.tbl.AllWatch(a.db.ReadTxn())
		rows := map[string]*nodes.Node{}
		for n := range all {
			rows[n.Name] = n
		}
		if ok(rows) {
			return rows
		}
		select {
		case <-watch:
		case <-ctx.Done():
			var seen []string
			for _, n := range rows {
				seen = append(seen, strings.Join(n.TableRow(), " | "))
			}
			t.Fatalf("nodes table: %s; has:\n%s", what, strings.Join(seen, "\n"))
		}
	}
}

// waitForDevices waits, on the devices table's watch channel, until ok holds.
func (a *agent) waitForDevices(t *testing.T, what string, ok func(statedb.ReadTxn) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		txn := a.db.ReadTxn()
		_, watch := a.devs.AllWatch(txn)
		if ok(txn) {
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("not within 30s: %s", what)
		}
	}
}

func k8sNode(name, ip string, podCIDRs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs}}
	if ip != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	}
	return n
}

// TestNodesFromKubernetes: Node objects make the table's remote nodes; a
// Node without address, or with a pod CIDR that overlaps this node's, is
// listed with its problem and its overlapping CIDR left out; this node's
// Node object gets its annotations, the NetworkUnavailable=False condition
// and loses the not-ready taint once the agent is ready; a deleted Node
// leaves the table.
func TestNodesFromKubernetes(t *testing.T) {
	self := k8sNode("node-1", "192.0.2.10")
	self.Spec.Taints = []corev1.Taint{{Key: "other", Effect: corev1.TaintEffectNoSchedule}, {Key: nodes.TaintAgentNotReady, Effect: corev1.TaintEffectNoSchedule}}
	self.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "NoRouteCreated"}}
	a := start(t, opts{name: "node-1", podCIDR: "10.244.1.0/24", nodeIP: []string{"192.0.2.10"}, k8s: []runtime.Object{
		self,
		k8sNode("node-2", "192.0.2.11", "10.244.2.0/24", "fd00:10:244:2::/64"),
		k8sNode("node-3", "", "10.244.3.0/24"),
		k8sNode("node-4", "192.0.2.14", "10.244.1.128/25"),
		k8sNode("node-5", "192.0.2.15", "10.244.5.0/24"),
		k8sNode("node-6", "192.0.2.16", "10.244.5.0/25", "10.244.6.0/24"),
	}})
	rows := a.wait(t, "six nodes and the local one from --node-ip", func(r map[string]*nodes.Node) bool {
		return len(r) == 6 && r["node-1"].Local && r["node-1"].Source == nodes.SourceLocal && r["node-6"] != nil
	})
	if ip := rows["node-1"].PrimaryIP(); ip != netip.MustParseAddr("192.0.2.10") || !slices.Equal(rows["node-1"].PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}) {
		t.Errorf("local node %+v", rows["node-1"])
	}
	if n := rows["node-2"]; n.Source != nodes.SourceK8s || n.PrimaryIP() != netip.MustParseAddr("192.0.2.11") || len(n.PodCIDRs) != 2 || len(n.Problems) != 0 {
		t.Errorf("node-2 %+v", n)
	}
	if n := rows["node-3"]; len(n.Problems) != 1 || !strings.Contains(n.Problems[0], "no InternalIP or ExternalIP") {
		t.Errorf("node-3 without address: problems %q", n.Problems)
	}
	if n := rows["node-4"]; len(n.PodCIDRs) != 0 || len(n.Problems) != 1 || !strings.Contains(n.Problems[0], "overlaps 10.244.1.0/24 of node node-1") {
		t.Errorf("node-4 overlapping this node: %+v", n)
	}
	// Two other nodes overlap: the one whose name sorts first keeps the
	// CIDR; the other keeps its other CIDR.
	if n := rows["node-6"]; !slices.Equal(n.PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.6.0/24")}) ||
		len(n.Problems) != 1 || !strings.Contains(n.Problems[0], "overlaps 10.244.5.0/24 of node node-5") || len(rows["node-5"].Problems) != 0 {
		t.Errorf("node-5 %+v and node-6 %+v overlapping", rows["node-5"], n)
	}
	if err := tables.WaitInitialized(context.Background(), a.db, a.tbl); err != nil {
		t.Fatal(err)
	}

	// This node's Node object.
	celltest.Eventually(t, "node-1 annotated, marked ready and untainted", func() (bool, string) {
		n, err := a.k8s.CoreV1().Nodes().Get(context.Background(), "node-1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse && c.Reason == "CelliumIsUp")
		}
		return ready && n.Annotations[nodes.AnnotationPodCIDRs] == "10.244.1.0/24" && n.Annotations["example.com/test"] == "yes" &&
			len(n.Spec.Taints) == 1 && n.Spec.Taints[0].Key == "other", fmt.Sprintf("annotations %v, conditions %+v, taints %+v", n.Annotations, n.Status.Conditions, n.Spec.Taints)
	})

	if err := a.k8s.CoreV1().Nodes().Delete(context.Background(), "node-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.wait(t, "node-2 gone", func(r map[string]*nodes.Node) bool { return r["node-2"] == nil && r["node-1"] != nil })
}

// TestNodesThroughKVStore: agents publish their node to the kvstore and
// see each other's; a key with garbage changes nothing else; a node whose
// key is deleted leaves the table, and a deleted key of a running agent is
// written back.
func TestNodesThroughKVStore(t *testing.T) {
	etcd := etcdtest.Start(t)
	a := start(t, opts{name: "node-a", podCIDR: "10.244.10.0/24", nodeIP: []string{"192.0.2.20"}, etcd: etcd.Endpoint()})
	b := start(t, opts{name: "node-b", podCIDR: "10.244.11.0/24", nodeIP: []string{"192.0.2.21"}, etcd: etcd.Endpoint()})
	seen := a.wait(t, "node-b from the kvstore", func(r map[string]*nodes.Node) bool {
		return r["node-b"] != nil && r["node-b"].Source == nodes.SourceKVStore && len(r["node-b"].PodCIDRs) == 1
	})
	if seen["node-b"].PrimaryIP() != netip.MustParseAddr("192.0.2.21") || seen["node-b"].PodCIDRs[0] != netip.MustParsePrefix("10.244.11.0/24") {
		t.Fatalf("node-b as node-a sees it: %+v", seen["node-b"])
	}
	b.wait(t, "node-a from the kvstore", func(r map[string]*nodes.Node) bool { return r["node-a"] != nil })

	ctx := context.Background()
	if _, err := a.kv.UpdateIfDifferent(ctx, "state/nodes/v1/node-x", []byte("{garbage")); err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(nodes.Value{Name: "node-c", Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.22")}}}})
	if _, err := a.kv.UpdateIfDifferent(ctx, "state/nodes/v1/node-c", v); err != nil {
		t.Fatal(err)
	}
	a.wait(t, "node-c, not the garbage key", func(r map[string]*nodes.Node) bool { return r["node-c"] != nil && r["node-x"] == nil && len(r) == 3 })
	if err := a.kv.Delete(ctx, "state/nodes/v1/node-c"); err != nil {
		t.Fatal(err)
	}
	a.wait(t, "node-c gone with its key", func(r map[string]*nodes.Node) bool { return r["node-c"] == nil && r["node-b"] != nil })

	// node-b's own key deleted while it runs: written back.
	if err := a.kv.Delete(ctx, "state/nodes/v1/node-b"); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "node-b's key written back", func() (bool, string) {
		_, found, err := a.kv.Get(ctx, "state/nodes/v1/node-b")
		return err == nil && found, fmt.Sprintf("found %v, %v", found, err)
	})
}

// TestLocalNodeFromDefaultRoute: without --node-ip, this node's address is
// the primary address of the device that holds the default route, and
// follows it when the default route moves.
func TestLocalNodeFromDefaultRoute(t *testing.T) {
	ns, eth0, eth1 := uplinks(t, "192.0.2.30/24", "198.51.100.30/24", false)
	var err error
	a := start(t, opts{name: "node-d", podCIDR: "10.244.12.0/24", netns: ns.Path()})
	a.wait(t, "the local node at eth0's address", func(r map[string]*nodes.Node) bool {
		return r["node-d"] != nil && r["node-d"].PrimaryIP() == netip.MustParseAddr("192.0.2.30")
	})
	// Devices and routes that have nothing to do with the default route,
	// as a pod's veth and its route, do not make the job list the routes
	// again; the default route moving does (a deletion and an addition).
	listings := a.routeListings(t)
	const unrelated = 10
	err = nettest.Do(ns.Path(), func() error {
		for i := range unrelated {
			name := fmt.Sprintf("lxc%d", i)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-peer"}); err != nil {
				return err
			}
			link, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
			_, dst, _ := net.ParseCIDR(fmt.Sprintf("10.244.12.%d/32", 10+i))
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = nettest.Do(ns.Path(), func() error {
		if err := netlink.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("192.0.2.1")}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth1.Attrs().Index, Gw: net.ParseIP("198.51.100.1")})
	})
	if err != nil {
		t.Fatal(err)
	}
	a.wait(t, "the local node at eth1's address once the default route moved", func(r map[string]*nodes.Node) bool {
		return r["node-d"] != nil && r["node-d"].PrimaryIP() == netip.MustParseAddr("198.51.100.30")
	})
	// The route changes come in order: by now the job has had those of
	// the veths. A little slack for late changes of eth0 and eth1 (an
	// IPv6 link-local address).
	if n := a.routeListings(t) - listings; n > 4 {
		t.Errorf("%v listings of the routes for %d unrelated devices with a route each and the default route moving, want at most 4", n, unrelated)
	}
}

// uplinks makes a namespace with the veths eth0 and eth1 up, with the
// addresses addr0 and addr1, and the default route through eth0's
// gateway (.1 of addr0); noIPv6 turns IPv6 off in it first.
func uplinks(t *testing.T, addr0, addr1 string, noIPv6 bool) (_ ns.NetNS, eth0, eth1 netlink.Link) {
	t.Helper()
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	err := nettest.Do(n.Path(), func() error {
		if noIPv6 {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		for i, name := range []string{"eth0", "eth1"} {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-peer"}); err != nil {
				return err
			}
			for _, l := range []string{name, name + "-peer"} {
				link, err := netlink.LinkByName(l)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetUp(link); err != nil {
					return err
				}
			}
			link, _ := netlink.LinkByName(name)
			addr, err := netlink.ParseAddr([]string{addr0, addr1}[i])
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(link, addr); err != nil {
				return err
			}
			if i == 0 {
				eth0 = link
			} else {
				eth1 = link
			}
		}
		gw := gatewayOf(addr0)
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n, eth0, eth1
}

// gatewayOf is .1 of the IPv4 prefix cidr.
func gatewayOf(cidr string) net.IP {
	_, p, _ := net.ParseCIDR(cidr)
	gw := slices.Clone(p.IP.To4())
	gw[3] = 1
	return gw
}

// routeListings is the agent's cellium_node_route_listings_total.
func (a *agent) routeListings(t *testing.T) float64 {
	t.Helper()
	return a.counter(t, "cellium_node_route_listings_total")
}

// TestLocalNodeIgnoresPodRoutes: routes that are not default routes of
// the main table (pods' host routes, on a device whose row does not
// change) make the local-node job compute nothing. They come in rounds,
// each received by a witness on the agent's shared route subscription
// before the next (so that the job, were it woken by them, would be many
// times); then the default route moves, which the job does compute, and
// since route updates come in order, once the node has its new address
// the job has had them all.
func TestLocalNodeIgnoresPodRoutes(t *testing.T) {
	a, ns, eth0, eth1 := startOnUplinks(t, "node-e", "10.244.13.0/24", "192.0.2.40/24", "198.51.100.40/24")
	var err error
	witness, err := drift.Subscribe(ns.Path(), drift.Kinds{Routes: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer witness.Close()
	computations := a.counter(t, "cellium_node_local_computations_total")
	const rounds, perRound = 20, 10
	for r := range rounds {
		err = nettest.Do(ns.Path(), func() error {
			for i := range perRound {
				dst := &net.IPNet{IP: net.IPv4(10, 244, 13, byte(r*perRound+i)), Mask: net.CIDRMask(32, 32)}
				if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		last := fmt.Sprintf("10.244.13.%d/32", r*perRound+perRound-1)
		for seen := false; !seen; {
			select {
			case <-witness.Ready():
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: the witness did not get %s in 10s", r, last)
			}
			b, err := witness.Take(math.MaxInt)
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range b.Routes {
				seen = seen || (u.Dst != nil && u.Dst.String() == last)
			}
		}
	}
	a.moveDefaultRoute(t, "node-e", ns, eth0, eth1, "192.0.2.40/24", "198.51.100.40/24")
	// The default route's deletion and addition: one computation each, or
	// one for both.
	if n := a.counter(t, "cellium_node_local_computations_total") - computations; n > 2 {
		t.Errorf("%v computations of the local node for %d pods' routes and the default route moving, want at most 2", n, rounds*perRound)
	}
}

// TestLocalNodeIgnoresPodDevices: pods' veths (host side lxc*, down, as
// an ADD makes them before it sets them up) come as rows of the devices
// table, in rounds, each seen in the table before the next; they hold no
// default route, and the job computes nothing for them. Then the default
// route moves, which it computes.
func TestLocalNodeIgnoresPodDevices(t *testing.T) {
	a, ns, eth0, eth1 := startOnUplinks(t, "node-v", "10.244.15.0/24", "192.0.2.60/24", "198.51.100.60/24")
	computations := a.counter(t, "cellium_node_local_computations_total")
	const rounds, perRound = 10, 5
	for r := range rounds {
		var names []string
		err := nettest.Do(ns.Path(), func() error {
			for i := range perRound {
				name := fmt.Sprintf("lxctest%d", r*perRound+i)
				names = append(names, name)
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		a.waitForDevices(t, fmt.Sprintf("round %d's veths", r), func(txn statedb.ReadTxn) bool {
			for _, name := range names {
				if _, _, found := a.devs.Get(txn, devices.DeviceName.Query(name)); !found {
					return false
				}
			}
			return true
		})
	}
	a.moveDefaultRoute(t, "node-v", ns, eth0, eth1, "192.0.2.60/24", "198.51.100.60/24")
	if n := a.counter(t, "cellium_node_local_computations_total") - computations; n > 2 {
		t.Errorf("%v computations of the local node for %d pods' veths and the default route moving, want at most 2", n, rounds*perRound*2)
	}
}

// startOnUplinks starts the agent node on uplinks eth0 (addr0, holding the
// default route) and eth1 (addr1), without IPv6 (no link-local addresses
// coming late: the rows of eth0 and eth1 stay as they are), once the node
// has eth0's address and the devices' rows settled (carrier, operstate).
func startOnUplinks(t *testing.T, node, podCIDR, addr0, addr1 string) (*agent, ns.NetNS, netlink.Link, netlink.Link) {
	t.Helper()
	ns, eth0, eth1 := uplinks(t, addr0, addr1, true)
	a := start(t, opts{name: node, podCIDR: podCIDR, netns: ns.Path()})
	ip0 := netip.MustParsePrefix(addr0).Addr()
	a.wait(t, "the local node at eth0's address", func(r map[string]*nodes.Node) bool {
		return r[node] != nil && r[node].PrimaryIP() == ip0
	})
	a.waitForDevices(t, "eth0 and eth1 running", func(txn statedb.ReadTxn) bool {
		for _, name := range []string{"eth0", "eth1"} {
			d, _, found := a.devs.Get(txn, devices.DeviceName.Query(name))
			if !found || d.Flags&net.FlagRunning == 0 {
				return false
			}
		}
		return true
	})
	return a, ns, eth0, eth1
}

// moveDefaultRoute moves the default route from eth0 (at addr0) to eth1
// (at addr1), each through the .1 of its subnet, and waits until the node
// is at addr1.
func (a *agent) moveDefaultRoute(t *testing.T, node string, ns ns.NetNS, eth0, eth1 netlink.Link, addr0, addr1 string) {
	t.Helper()
	err := nettest.Do(ns.Path(), func() error {
		if err := netlink.RouteDel(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gatewayOf(addr0)}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth1.Attrs().Index, Gw: gatewayOf(addr1)})
	})
	if err != nil {
		t.Fatal(err)
	}
	ip1 := netip.MustParsePrefix(addr1).Addr()
	a.wait(t, "the local node at eth1's address once the default route moved", func(r map[string]*nodes.Node) bool {
		return r[node] != nil && r[node].PrimaryIP() == ip1
	})
}

// TestLocalNodeIgnoresOrdinaryEndpoints: the local node reads the health
// endpoints' addresses only, so the endpoints of pods, each written in a
// transaction of its own as ADDs do, make it compute nothing (woken by
// each, it would walk every endpoint each time: quadratic in a burst);
// a health endpoint's coming and change are each computed.
func TestLocalNodeIgnoresOrdinaryEndpoints(t *testing.T) {
	a := start(t, opts{name: "node-h", podCIDR: "10.244.14.0/24", nodeIP: []string{"192.0.2.50"}})
	a.wait(t, "the local node", func(r map[string]*nodes.Node) bool { return r["node-h"] != nil })
	insert := func(ep *endpointmanager.Endpoint) {
		txn := a.db.WriteTxn(a.eps)
		if _, _, err := a.eps.Insert(txn, ep); err != nil {
			t.Fatal(err)
		}
		txn.Commit()
	}
	hasHealthIP := func(ip string) func(map[string]*nodes.Node) bool {
		return func(r map[string]*nodes.Node) bool {
			return r["node-h"] != nil && slices.Contains(r["node-h"].HealthIPs, netip.MustParseAddr(ip))
		}
	}
	computations := a.counter(t, "cellium_node_local_computations_total")
	const pods = 200
	for i := range pods {
		insert(&endpointmanager.Endpoint{ID: uint16(i + 1), ContainerID: fmt.Sprintf("pod-%d", i),
			IPv4: netip.AddrFrom4([4]byte{10, 244, 14, byte(i + 2)}), State: endpointmanager.Ready})
	}
	// Written after the pods' endpoints: once the node has its address,
	// the job has seen them all.
	insert(&endpointmanager.Endpoint{ID: pods + 1, ContainerID: "health", Health: true,
		IPv4: netip.MustParseAddr("10.244.14.250"), State: endpointmanager.Ready})
	a.wait(t, "the health endpoint's address", hasHealthIP("10.244.14.250"))
	if n := a.counter(t, "cellium_node_local_computations_total") - computations; n > 1 {
		t.Errorf("%v computations of the local node for %d pods' endpoints and the health endpoint, want 1", n, pods)
	}
	// A change of the health endpoint is computed.
	insert(&endpointmanager.Endpoint{ID: pods + 1, ContainerID: "health", Health: true,
		IPv4: netip.MustParseAddr("10.244.14.251"), State: endpointmanager.Ready})
	a.wait(t, "the health endpoint's new address", hasHealthIP("10.244.14.251"))
}

// counter is the agent's metric name, a counter without labels.
func (a *agent) counter(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := a.m.Value(t, name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	return v
}
