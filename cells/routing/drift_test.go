package routing_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/drift/drifttest"
	"github.com/cellium/cellium/cells/routing"
	"github.com/cellium/cellium/pkg/nettest"
)

// tunnelEntries are node n's routes of the agent's and the tunnel device's
// permanent neighbor and fdb entries, as "kind what" lines, sorted.
func (n *testNode) tunnelEntries(t *testing.T) []string {
	t.Helper()
	out := []string{}
	for _, r := range n.kernelRoutes(t) {
		out = append(out, "route "+r)
	}
	nettest.Do(n.ns.Path(), func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		if err != nil {
			return nil
		}
		neighs, _ := netlink.NeighList(link.Attrs().Index, netlink.FAMILY_V4)
		for _, e := range neighs {
			if e.State&netlink.NUD_PERMANENT != 0 {
				out = append(out, fmt.Sprintf("neigh %s lladdr %s", e.IP, e.HardwareAddr))
			}
		}
		fdb, _ := netlink.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
		for _, e := range fdb {
			if e.State&netlink.NUD_PERMANENT != 0 {
				out = append(out, fmt.Sprintf("fdb %s dst %s", e.HardwareAddr, e.IP))
			}
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// waitAllDone waits until every row of the three tables is Done.
func (n *testNode) waitAllDone(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		txn := n.db.ReadTxn()
		var watches []<-chan struct{}
		notDone := []string{}
		check := func(kind reconciler.StatusKind, row string) {
			if kind != reconciler.StatusKindDone {
				notDone = append(notDone, row)
			}
		}
		routes, w1 := n.routes.AllWatch(txn)
		for r := range routes {
			check(r.Status.Kind, r.String()+" "+r.Status.String())
		}
		neighs, w2 := n.neighbors.AllWatch(txn)
		for r := range neighs {
			check(r.Status.Kind, r.String()+" "+r.Status.String())
		}
		fdb, w3 := n.fdb.AllWatch(txn)
		for r := range fdb {
			check(r.Status.Kind, r.String()+" "+r.Status.String())
		}
		if len(notDone) == 0 {
			return
		}
		watches = append(watches, w1, w2, w3)
		select {
		case <-watches[0]:
		case <-watches[1]:
		case <-watches[2]:
		case <-ctx.Done():
			t.Fatalf("%s: rows not done: %v", n.name, notDone)
		}
	}
}

// wantRepairs checks the repairs counted for each kind of object.
func (n *testNode) wantRepairs(t *testing.T, want map[string]float64) {
	t.Helper()
	for _, object := range []string{"link", "route", "neigh", "fdb"} {
		if got := drifttest.Repairs(t, n.metrics, "routing", object); got != want[object] {
			t.Errorf("%s: cellium_kernel_repairs_total{module=routing,object=%s} = %v, want %v", n.name, object, got, want[object])
		}
	}
}

// wantRepairLog checks that a repair of object naming what was logged.
func (n *testNode) wantRepairLog(t *testing.T, object, what string) {
	t.Helper()
	if n.logs.Find("Put back kernel state changed behind the agent's back", "object", object, "what", what) == nil {
		t.Errorf("%s: no log line for the repair of %s %q", n.name, object, what)
	}
}

// TestTunnelDrift: what is deleted behind the agent's back (the tunnel
// device, one of its routes, neighbor or fdb entries) is put back without
// a restart, logged and counted; a refresh of a kernel that is right
// writes nothing.
func TestTunnelDrift(t *testing.T) {
	a, b, _ := twoAgents(t, routing.ModeTunnel)
	a.waitAllDone(t)
	want := a.tunnelEntries(t)
	if len(want) != 3 {
		t.Fatalf("node-a's tunnel state %q: want a route, a neighbor and an fdb entry", want)
	}
	a.wantRepairs(t, nil)
	tcp(t, a, b)

	restored := func(what string) {
		t.Helper()
		celltest.Eventually(t, what+" put back", func() (bool, string) {
			got := a.tunnelEntries(t)
			return slices.Equal(got, want), fmt.Sprint(got)
		})
		a.waitAllDone(t)
	}
	inA := func(fn func() error) {
		t.Helper()
		if err := nettest.Do(a.ns.Path(), fn); err != nil {
			t.Fatal(err)
		}
	}

	// ip link del cellium_vxlan
	inA(func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		if err != nil {
			return err
		}
		return netlink.LinkDel(link)
	})
	restored("the tunnel device and its route, neighbor and fdb entry")
	tcp(t, a, b)
	a.wantRepairs(t, map[string]float64{"link": 1, "route": 1, "neigh": 1, "fdb": 1})
	gw := b.podCIDR.Addr()
	mac := fmt.Sprintf("0e:ce:c0:00:02:%02x", b.ip.As4()[3])
	a.wantRepairLog(t, "link", "cellium_vxlan (VXLAN 2, UDP 8472)")
	a.wantRepairLog(t, "route", fmt.Sprintf("%s via %s dev cellium_vxlan onlink", b.podCIDR, gw))
	a.wantRepairLog(t, "neigh", fmt.Sprintf("%s lladdr %s dev cellium_vxlan", gw, mac))
	a.wantRepairLog(t, "fdb", fmt.Sprintf("%s dst %s dev cellium_vxlan", mac, b.ip))

	// ip link set cellium_vxlan down: its IPv4 routes go, with no event,
	// and so do its neighbor entries.
	inA(func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		if err != nil {
			return err
		}
		return netlink.LinkSetDown(link)
	})
	restored("the tunnel device up, its route and neighbor entry")
	a.wantRepairs(t, map[string]float64{"link": 2, "route": 2, "neigh": 2, "fdb": 1})
	a.wantRepairLog(t, "link", "cellium_vxlan up")

	// ip route del, ip neigh del, bridge fdb del: one at a time.
	inA(func() error {
		return netlink.RouteDel(&netlink.Route{Dst: ipNet(b.podCIDR), Protocol: routing.RouteProtocol, Table: unix.RT_TABLE_MAIN})
	})
	restored("the route")
	inA(func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		if err != nil {
			return err
		}
		return netlink.NeighDel(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, IP: gw.AsSlice()})
	})
	restored("the neighbor entry")
	inA(func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		if err != nil {
			return err
		}
		hw, _ := net.ParseMAC(mac)
		return netlink.NeighDel(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
			State: netlink.NUD_PERMANENT, IP: b.ip.AsSlice(), HardwareAddr: hw})
	})
	restored("the fdb entry")
	a.wantRepairs(t, map[string]float64{"link": 2, "route": 3, "neigh": 3, "fdb": 2})
	tcp(t, a, b)

	// No drift: a refresh of every row writes nothing.
	changes := watchChanges(t, a)
	routing.RefreshAll(a.db, a.routes, a.neighbors, a.fdb)
	a.waitAllDone(t)
	if got := changes(); len(got) != 0 {
		t.Fatalf("a refresh of a kernel that is right changed %q", got)
	}
	a.wantRepairs(t, map[string]float64{"link": 2, "route": 3, "neigh": 3, "fdb": 2})
}

// watchChanges records the updates of the agent's routes and of the
// tunnel device's neighbor and fdb entries in node n's namespace from now;
// the function it returns lists them, up to a marker route and neighbor it
// adds last (netlink delivers in order), so that nothing made before them
// is still on its way.
func watchChanges(t *testing.T, n *testNode) func() []string {
	t.Helper()
	routes := make(chan netlink.RouteUpdate, 100)
	neighs := make(chan netlink.NeighUpdate, 100)
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	err := nettest.Do(n.ns.Path(), func() error {
		if err := netlink.RouteSubscribe(routes, done); err != nil {
			return err
		}
		return netlink.NeighSubscribe(neighs, done)
	})
	if err != nil {
		t.Fatal(err)
	}
	tunnel := 0
	nettest.Do(n.ns.Path(), func() error {
		link, err := netlink.LinkByName(routing.TunnelDevice)
		if err == nil {
			tunnel = link.Attrs().Index
		}
		return err
	})
	marker := netip.MustParsePrefix("10.250.99.0/24")
	markerIP := netip.MustParseAddr("192.0.2.99")
	return func() []string {
		err := nettest.Do(n.ns.Path(), func() error {
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
				IP: markerIP.AsSlice(), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 99}}); err != nil {
				return err
			}
			return netlink.RouteAdd(&netlink.Route{Dst: ipNet(marker), Gw: net.ParseIP("192.0.2.2"), LinkIndex: eth0.Attrs().Index})
		})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		timeout := time.After(10 * time.Second)
		for sawRoute, sawNeigh := false, false; !sawRoute || !sawNeigh; {
			select {
			case u := <-routes:
				if u.Dst != nil && u.Dst.String() == marker.String() {
					sawRoute = true
				} else if u.Protocol == routing.RouteProtocol {
					got = append(got, fmt.Sprintf("route %d %s", u.Type, u.Dst))
				}
			case u := <-neighs:
				if u.IP.Equal(markerIP.AsSlice()) {
					sawNeigh = true
				} else if u.LinkIndex == tunnel {
					got = append(got, fmt.Sprintf("neighbor %d %s %s", u.Type, u.IP, u.HardwareAddr))
				}
			case <-timeout:
				t.Fatalf("the marker route and neighbor did not come; so far %q", got)
			}
		}
		return got
	}
}

// TestNativeDrift: in native mode, a node device set down and up again
// has lost the agent's routes through it, with no route event: they are
// put back once it is up, logged and counted.
func TestNativeDrift(t *testing.T) {
	a, b, _ := twoAgents(t, routing.ModeNative)
	want := a.kernelRoutes(t)
	for _, up := range []bool{false, true} {
		err := nettest.Do(a.ns.Path(), func() error {
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if up {
				return netlink.LinkSetUp(eth0)
			}
			return netlink.LinkSetDown(eth0)
		})
		if err != nil {
			t.Fatal(err)
		}
		if !up {
			celltest.Eventually(t, "the route gone with eth0 down", func() (bool, string) { got := a.kernelRoutes(t); return len(got) == 0, fmt.Sprint(got) })
		}
	}
	celltest.Eventually(t, "the route put back", func() (bool, string) { got := a.kernelRoutes(t); return slices.Equal(got, want), fmt.Sprint(got) })
	a.waitAllDone(t)
	a.wantRepairs(t, map[string]float64{"route": 1})
	a.wantRepairLog(t, "route", fmt.Sprintf("%s via %s", b.podCIDR, b.ip))
	tcp(t, a, b)
}
