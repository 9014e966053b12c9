package routing_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/logtest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/cells/routing"
	"github.com/cellium/cellium/pkg/nettest"
)

// testNode is a node namespace: eth0 on a veth to the other node's, a
// "pod" address on lo inside its pod CIDR, and an agent's routing cells
// (with the nodes and devices cells they read) pointed at the namespace.
type testNode struct {
	name    string
	ns      ns.NetNS
	ip      netip.Addr
	podCIDR netip.Prefix
	pod     netip.Addr
	dir     string

	h         *hive.Hive
	db        *statedb.DB
	routes    statedb.Table[*routing.Route]
	neighbors statedb.Table[*routing.Neighbor]
	fdb       statedb.Table[*routing.FDBEntry]
	k8s       *k8sclient.Fake
	metrics   *prometheus.Registry
	logs      *logtest.Recorder
}

func k8sNode(name string, ip netip.Addr, cidr netip.Prefix) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: []string{cidr.String()}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}}}
}

// twoNodes makes node-a and node-b, their namespaces joined by a veth
// (192.0.2.0/24), their pod CIDRs blackholed as a whole so that nothing
// unrouted leaves either namespace.
func twoNodes(t *testing.T) (*testNode, *testNode) {
	nettest.RequireRoot(t)
	a := &testNode{name: "node-a", ns: nettest.NewNS(t), ip: netip.MustParseAddr("192.0.2.1"),
		podCIDR: netip.MustParsePrefix("10.250.1.0/24"), pod: netip.MustParseAddr("10.250.1.5"), dir: t.TempDir()}
	b := &testNode{name: "node-b", ns: nettest.NewNS(t), ip: netip.MustParseAddr("192.0.2.2"),
		podCIDR: netip.MustParsePrefix("10.250.2.0/24"), pod: netip.MustParseAddr("10.250.2.5"), dir: t.TempDir()}
	err := nettest.Do(a.ns.Path(), func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "peer"}); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("peer")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, int(b.ns.Fd()))
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []*testNode{a, b} {
		err := nettest.Do(n.ns.Path(), func() error {
			if peer, err := netlink.LinkByName("peer"); err == nil {
				if err := netlink.LinkSetName(peer, "eth0"); err != nil {
					return err
				}
			}
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			for _, step := range []func() error{
				func() error { return netlink.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.ip, 24))}) },
				func() error { return netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.pod, 32))}) },
				func() error { return netlink.LinkSetUp(eth0) },
				func() error { return netlink.LinkSetUp(lo) },
				func() error {
					return netlink.RouteAdd(&netlink.Route{Dst: ipNet(netip.MustParsePrefix("10.250.0.0/16")), Type: unix.RTN_BLACKHOLE})
				},
			} {
				if err := step(); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", n.name, err)
		}
	}
	return a, b
}

// twoAgents starts an agent in mode on each of twoNodes, both knowing
// the two Node objects (objs, to start one again), and waits until each
// has the other's route in the kernel.
func twoAgents(t *testing.T, mode string) (a, b *testNode, objs []runtime.Object) {
	a, b = twoNodes(t)
	objs = []runtime.Object{k8sNode("node-a", a.ip, a.podCIDR), k8sNode("node-b", b.ip, b.podCIDR)}
	a.start(t, mode, objs...)
	b.start(t, mode, objs...)
	a.waitReconciled(t, 1)
	b.waitReconciled(t, 1)
	return a, b, objs
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// start runs the node's cells in mode, knowing the given Node objects.
func (n *testNode) start(t *testing.T, mode string, objs ...runtime.Object) {
	t.Helper()
	n.h = celltest.New(daemon.Cell, metrics.Cell, ipam.Cell, devices.Cell, kvstore.Cell, k8sclienttest.Cell(objs...), nodes.Cell, routing.Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(db *statedb.DB, routes statedb.Table[*routing.Route], neighbors statedb.Table[*routing.Neighbor],
			fdb statedb.Table[*routing.FDBEntry], cs *k8sclient.Fake, reg *prometheus.Registry) {
			n.db, n.routes, n.neighbors, n.fdb, n.k8s, n.metrics = db, routes, neighbors, fdb, cs, reg
		}))
	hive.AddConfigOverride(n.h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(n.dir, "state"), filepath.Join(n.dir, "run"), n.name
	})
	hive.AddConfigOverride(n.h, func(c *ipam.Config) { c.PodCIDR = []string{n.podCIDR.String()} })
	hive.AddConfigOverride(n.h, func(c *nodes.Config) { c.NodeIP = []string{n.ip.String()} })
	hive.AddConfigOverride(n.h, func(c *devices.Config) { c.DevicesNetns = n.ns.Path() })
	hive.AddConfigOverride(n.h, func(c *routing.Config) { c.RoutingMode = mode })
	n.logs = logtest.NewRecorder(hivetest.Logger(t).Handler())
	log := slog.New(n.logs)
	if err := n.h.Start(log, context.Background()); err != nil {
		t.Fatalf("start %s: %v", n.name, err)
	}
	h := n.h
	t.Cleanup(func() { h.Stop(log, context.Background()) })
}

func (n *testNode) stop(t *testing.T) {
	if err := n.h.Stop(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatal(err)
	}
}

// waitReconciled waits until the routes table has want routes, all in the
// kernel.
func (n *testNode) waitReconciled(t *testing.T, want int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		all, watch := n.routes.AllWatch(n.db.ReadTxn())
		count, done := 0, 0
		var rows []string
		for r := range all {
			count++
			if r.Status.Kind == reconciler.StatusKindDone {
				done++
			}
			rows = append(rows, strings.Join(r.TableRow(), " "))
		}
		if count == want && done == want {
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("%s: routes table %v, want %d routes done", n.name, rows, want)
		}
	}
}

// kernelRoutes are the agent's routes in the node's namespace, as
// "prefix via gateway dev".
func (n *testNode) kernelRoutes(t *testing.T) []string {
	t.Helper()
	var out []string
	err := nettest.Do(n.ns.Path(), func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routing.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		for _, r := range routes {
			dev := ""
			if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				dev = link.Attrs().Name
			}
			out = append(out, fmt.Sprintf("%s via %s dev %s", r.Dst, r.Gw, dev))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tcp connects from one node's pod address to the other's and checks the
// bytes come back: the path crosses the tunnel (or the native routes) both
// ways, since both ends are pod addresses.
func tcp(t *testing.T, from, to *testNode) {
	t.Helper()
	var ln net.Listener
	if err := nettest.Do(to.ns.Path(), func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(to.pod, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	err := nettest.Do(from.ns.Path(), func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.pod.AsSlice()}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("hello")); err != nil {
			return err
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
			return fmt.Errorf("echo: %q, %v", buf, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("TCP %s -> %s: %v", from.pod, ln.Addr(), err)
	}
}

func TestTunnel(t *testing.T) {
	a, b, _ := twoAgents(t, routing.ModeTunnel)
	if got, want := a.kernelRoutes(t), []string{"10.250.2.0/24 via 10.250.2.0 dev cellium_vxlan"}; strings.Join(got, ";") != strings.Join(want, ";") {
		t.Fatalf("node-a's routes %v, want %v", got, want)
	}
	var vx *netlink.Vxlan
	nettest.Do(a.ns.Path(), func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		vx, _ = link.(*netlink.Vxlan)
		return err
	})
	if vx == nil || vx.Port != 8472 || vx.MTU != 1450 || vx.Learning {
		t.Fatalf("tunnel device %+v, want VXLAN on 8472, MTU 1450 (1500 less 50), no learning", vx)
	}
	tcp(t, a, b)
	tcp(t, b, a)

	// The packets did cross the tunnel: its counters moved.
	nettest.Do(a.ns.Path(), func() error {
		link, _ := netlink.LinkByName(routing.TunnelDevice)
		if s := link.Attrs().Statistics; s == nil || s.TxPackets == 0 || s.RxPackets == 0 {
			t.Errorf("tunnel device counters %+v: nothing went through it", s)
		}
		return nil
	})

	// node-b leaves: node-a removes its route, neighbor and fdb entry.
	if err := a.k8s.CoreV1().Nodes().Delete(context.Background(), "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitReconciled(t, 0)
	celltest.Eventually(t, "node-b's route, neighbor and fdb entry gone from node-a", func() (bool, string) {
		var left []string
		nettest.Do(a.ns.Path(), func() error {
			link, err := netlink.LinkByName(routing.TunnelDevice)
			if err != nil {
				return err
			}
			neighs, _ := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
			fdb, _ := netlink.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
			for _, n := range append(neighs, fdb...) {
				left = append(left, n.String())
			}
			return nil
		})
		routes := a.kernelRoutes(t)
		return len(left) == 0 && len(routes) == 0, fmt.Sprintf("neighbors and fdb entries %v, routes %v", left, routes)
	})
}

func TestNative(t *testing.T) {
	a, b, _ := twoAgents(t, routing.ModeNative)
	if got, want := a.kernelRoutes(t), []string{"10.250.2.0/24 via 192.0.2.2 dev eth0"}; strings.Join(got, ";") != strings.Join(want, ";") {
		t.Fatalf("node-a's routes %v, want %v", got, want)
	}
	tcp(t, a, b)
	tcp(t, b, a)
}

// TestRestart: a restarted agent writes no route, neighbor or fdb entry
// that is already right, prunes what is stale (its own routes only), and
// traffic flows while it is down.
func TestRestart(t *testing.T) {
	a, b, objs := twoAgents(t, routing.ModeTunnel)
	a.stop(t)
	tcp(t, a, b) // with node-a's agent down

	// A stale route of the agent's, and one of someone else's.
	err := nettest.Do(a.ns.Path(), func() error {
		eth0, _ := netlink.LinkByName("eth0")
		if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(netip.MustParsePrefix("10.250.9.0/24")), Gw: net.ParseIP("192.0.2.9"),
			LinkIndex: eth0.Attrs().Index, Protocol: routing.RouteProtocol}); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Dst: ipNet(netip.MustParsePrefix("10.250.8.0/24")), Gw: net.ParseIP("192.0.2.8"),
			LinkIndex: eth0.Attrs().Index})
	})
	if err != nil {
		t.Fatal(err)
	}

	// Every route, neighbor and link change in node-a's namespace while
	// its agent starts again.
	changes := make(chan string, 100)
	done := make(chan struct{})
	defer close(done)
	err = nettest.Do(a.ns.Path(), func() error {
		routes := make(chan netlink.RouteUpdate, 100)
		neighs := make(chan netlink.NeighUpdate, 100)
		if err := netlink.RouteSubscribe(routes, done); err != nil {
			return err
		}
		if err := netlink.NeighSubscribe(neighs, done); err != nil {
			return err
		}
		go func() {
			for {
				select {
				case u, ok := <-routes:
					if !ok {
						return
					}
					if u.Dst != nil && u.Dst.IP.IsLinkLocalUnicast() {
						// The kernel's own IPv6 link-local routes, which
						// come whenever its address autoconfiguration
						// finishes (late on a loaded machine).
						continue
					}
					changes <- fmt.Sprintf("route %d %s", u.Type, u.Dst)
				case u, ok := <-neighs:
					if !ok {
						return
					}
					changes <- fmt.Sprintf("neighbor %d %s %s", u.Type, u.IP, u.HardwareAddr)
				}
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	a.start(t, routing.ModeTunnel, objs...)
	a.waitReconciled(t, 1)
	celltest.Eventually(t, "the stale route pruned", func() (bool, string) {
		got := a.kernelRoutes(t)
		return len(got) == 1 && strings.HasPrefix(got[0], "10.250.2.0/24"), fmt.Sprint(got)
	})
	tcp(t, a, b)
	var seen []string
	for len(changes) > 0 {
		seen = append(seen, <-changes)
	}
	if len(seen) != 1 || !strings.Contains(seen[0], fmt.Sprintf("route %d 10.250.9.0/24", unix.RTM_DELROUTE)) {
		t.Fatalf("changes while the agent restarted: %q; want only the stale route's removal", seen)
	}
	foreign := false
	nettest.Do(a.ns.Path(), func() error {
		routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
		for _, r := range routes {
			foreign = foreign || (r.Dst != nil && r.Dst.String() == "10.250.8.0/24")
		}
		return nil
	})
	if !foreign {
		t.Fatal("the agent pruned a route it does not own")
	}
}
