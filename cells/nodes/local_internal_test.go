package nodes

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestRouteSubscriptionStopDrains: stopping the local node's route
// subscription, with more updates pending than its channel holds, ends
// netlink's receiving goroutine (it closes the channel), which would stay
// blocked sending an update if nothing read the channel.
func TestRouteSubscriptionStopDrains(t *testing.T) {
	nettest.RequireRoot(t)
	ns, h := nettest.Netlink(t, nettest.NewNS(t).Path())
	routes, stop, err := subscribeRoutes(nil, &ns)
	if err != nil {
		t.Fatal(err)
	}
	// More than the channel's 16, none read.
	for i := range 40 {
		r := &netlink.Route{Type: unix.RTN_BLACKHOLE, Dst: &net.IPNet{IP: net.IPv4(10, 99, byte(i), 0), Mask: net.CIDRMask(24, 32)}}
		if err := h.RouteAdd(r); err != nil {
			t.Fatalf("add route %v: %v", r.Dst, err)
		}
	}
	// The channel full: netlink's goroutine is blocked sending the 17th.
	polltest.Until(t, "the route channel full", 10*time.Second, time.Millisecond, func() (bool, string) {
		return len(routes) == cap(routes), fmt.Sprintf("%d of %d", len(routes), cap(routes))
	})
	stop()
	select {
	case _, ok := <-routes:
		if ok {
			t.Fatal("after the stop the channel still holds updates: netlink's goroutine may be blocked sending one")
		}
	default:
		t.Fatal("after the stop the channel is open: netlink's goroutine has not ended")
	}
}
