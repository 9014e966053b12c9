package endpointmanager_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/drift/drifttest"
)

// hostRoute is the host's route to ip through the endpoint's host side,
// nil when there is none.
func hostRoute(t *testing.T, ep *endpointmanager.Endpoint, ip netip.Addr) *netlink.Route {
	t.Helper()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	dst := &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
	routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.LinkIndex == ep.HostIfIndex {
			return &r
		}
	}
	return nil
}

// TestHostRouteDrift: a pod's host route deleted by hand is put back
// without a restart (and without a CNI CHECK), logged and counted; a
// refresh when every route is there writes nothing.
func TestHostRouteDrift(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	n.waitRestored(t)
	ep := n.create(t, newPod(t))
	repairs := func() float64 { return drifttest.Repairs(t, n.metrics, "endpoint-manager", "host-route") }

	for i, ip := range ep.IPs() {
		r := hostRoute(t, ep, ip)
		if r == nil {
			t.Fatalf("no host route to %s after the endpoint was made", ip)
		}
		// ip route del <pod address>
		if err := netlink.RouteDel(r); err != nil {
			t.Fatal(err)
		}
		// The repair writes the route, then counts and logs it: the
		// route can be back before the count is, so the wait is for
		// the log line, the repair's last step.
		what := fmt.Sprintf("%s dev %s (endpoint %d)", netip.PrefixFrom(ip, ip.BitLen()), ep.HostIfName, ep.ID)
		celltest.Eventually(t, fmt.Sprintf("the host route to %s put back and logged", ip), func() (bool, string) {
			if r := hostRoute(t, ep, ip); r == nil {
				return false, "no route"
			}
			if n.logs.Find("Put back kernel state changed behind the agent's back", "object", "host-route", "what", what) == nil {
				return false, fmt.Sprintf("no log line for the repair of %q", what)
			}
			return true, ""
		})
		if got, want := repairs(), float64(i+1); got != want {
			t.Fatalf("repairs = %v, want %v", got, want)
		}
	}
	check, err := n.client.CheckEndpoint(t.Context(), fmt.Sprint(ep.ID))
	if err != nil || len(check.Problems) != 0 {
		t.Fatalf("check after the repairs: %+v, %v", check, err)
	}

	// No drift: a refresh writes no route. Route updates for the
	// endpoint's addresses are watched until a marker route of the test
	// range comes (netlink delivers in order).
	updates := make(chan netlink.RouteUpdate, 100)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribe(updates, done); err != nil {
		t.Fatal(err)
	}
	n.mgr.RefreshHostRoutes()
	marker := &netlink.Route{Dst: &net.IPNet{IP: tn.v4.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}, Type: unix.RTN_BLACKHOLE}
	if err := netlink.RouteAdd(marker); err != nil {
		t.Fatal(err)
	}
	defer netlink.RouteDel(marker)
	timeout := time.After(10 * time.Second)
	for {
		select {
		case u := <-updates:
			if u.Dst == nil {
				continue
			}
			if u.Dst.String() == marker.Dst.String() {
				if got := repairs(); got != 2 {
					t.Fatalf("repairs after a refresh with no drift = %v, want still 2", got)
				}
				return
			}
			if ip, ok := netip.AddrFromSlice(u.Dst.IP); ok && (ip.Unmap() == ep.IPv4 || ip.Unmap() == ep.IPv6) {
				t.Fatalf("a refresh with no drift changed the route %s (type %d)", u.Dst, u.Type)
			}
		case <-timeout:
			t.Fatal("the marker route's update did not come")
		}
	}
}
