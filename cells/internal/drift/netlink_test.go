package drift_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/pkg/nettest"
)

// okHealth is the cell.Health a Follower reports to; it only says OK.
type okHealth struct{ cell.Health }

func (okHealth) OK(string) {}

// signalHealth closes its channel when the Follower says OK: it follows.
type signalHealth struct {
	cell.Health
	ok chan struct{}
}

func (h signalHealth) OK(string) { close(h.ok) }

// TestFollowerListsWithoutDisturbingOtherSubscribers: a Follower's listing
// of the devices reaches its Handle first, and no other link subscriber in
// the namespace (the devices watcher is one) receives anything but the
// kernel's messages. Listing through the subscription (netlink's
// ListExisting) multicast the dump request to them, and each reported
// "Wrong sender portid".
func TestFollowerListsWithoutDisturbingOtherSubscribers(t *testing.T) {
	n := nettest.NewNS(t)
	ns, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatalf("open %s: %v", n.Path(), err)
	}
	defer ns.Close()

	// The other subscriber.
	other := drift.NewLinkWitness(t, ns)

	batches := make(chan drift.Batch, 16)
	f := &drift.Follower{Netns: n.Path(), Links: true, Handle: func(_ context.Context, b drift.Batch) { batches <- b }}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- f.Run(ctx, okHealth{}) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	select {
	case b := <-batches:
		if len(b.Links) != 1 || b.Links[0].Attrs().Name != "lo" || b.Links[0].Index != int32(b.Links[0].Attrs().Index) {
			t.Fatalf("first batch %+v, want the listing: lo, with its index", b.Links)
		}
	case err := <-ran:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no batch after 10s")
	}

	// A change after the listing: once the other subscriber has it, it
	// has every message sent to it before.
	drift.AddMarker(t, ns)
	drift.AwaitMarker(t, "the other subscriber", other.Updates)
	for _, err := range other.Errors() {
		t.Errorf("the other subscriber got an error: %v", err)
	}
}

// TestFollowerTakesABurst: while its Handle is busy, a burst of route
// updates (3,000: a hundred pods' ADDs bring several hundred) queues
// behind it, and the Follower then hands over every one. With the
// kernel's default socket buffer the kernel dropped them (ENOBUFS): Run
// ended, and the next one started over with a Resync.
func TestFollowerTakesABurst(t *testing.T) {
	const burst = 3000
	n := nettest.NewNS(t)
	_, h := nettest.Netlink(t, n.Path())
	dev := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "burst0"}, PeerName: "burst1"}
	if err := h.LinkAdd(dev); err != nil {
		t.Fatalf("add %s: %v", dev.Name, err)
	}
	for _, name := range []string{"burst0", "burst1"} {
		link, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(link)
		}
		if err != nil {
			t.Fatalf("set %s up: %v", name, err)
		}
	}
	link, err := h.LinkByName("burst0")
	if err != nil {
		t.Fatal(err)
	}
	index := link.Attrs().Index
	// route i is 10.99.x.y/32 through burst0.
	addRoute := func(i int) {
		t.Helper()
		dst := &net.IPNet{IP: net.IPv4(10, 99, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
			t.Fatalf("add route %d: %v", i, err)
		}
	}

	busy, release := make(chan struct{}), make(chan struct{})
	// Each batch's count of the burst's routes, and whether it was a Resync.
	type batch struct {
		routes int
		resync bool
	}
	batches := make(chan batch, burst+16)
	first := true
	f := &drift.Follower{Netns: n.Path(), Routes: true, Handle: func(_ context.Context, b drift.Batch) {
		if first {
			first = false
			close(busy)
			<-release
		}
		got := batch{resync: b.Resync}
		for _, u := range b.Routes {
			if u.Type == unix.RTM_NEWROUTE && u.Dst != nil && u.Dst.IP.To4() != nil && u.Dst.IP.To4()[1] == 99 {
				got.routes++
			}
		}
		batches <- got
	}}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	following := make(chan struct{})
	go func() { ran <- f.Run(ctx, signalHealth{ok: following}) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-following:
	case err := <-ran:
		t.Fatalf("Run ended: %v", err)
	}

	// The first route's batch keeps Handle busy while the rest come.
	addRoute(0)
	select {
	case <-busy:
	case err := <-ran:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no batch 10s after the first route")
	}
	for i := 1; i < burst; i++ {
		addRoute(i)
	}
	close(release)
	seen := 0
	timeout := time.After(30 * time.Second)
	for seen < burst {
		select {
		case b := <-batches:
			if b.resync {
				t.Fatalf("a Resync after %d of the %d routes: updates were lost", seen, burst)
			}
			seen += b.routes
		case err := <-ran:
			ran <- err // for the deferred check
			t.Fatalf("Run ended after %d of the %d routes: %v", seen, burst, err)
		case <-timeout:
			t.Fatalf("%d of the %d routes handed over after 30s", seen, burst)
		}
	}
}
