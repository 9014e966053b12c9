package devices

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/pkg/nettest"
)

// burstAddrs is how many addresses TestSubscriptionTakesABurst adds while
// nothing takes them: more than a socket buffer of net.core.rmem_default
// (208 KiB) holds, and than the 1,024 a channel held before.
const burstAddrs = 1500

// TestSubscriptionTakesABurst: link and address changes made while a batch
// is written (many pods' veths created at once) wait (in the hub's queue
// for the watcher, in the kernel's socket buffer) and are all applied
// after it; the subscription does not end with "no buffer space", nor the
// watcher's queue overflow, either of which costs a new listing of
// everything.
func TestSubscriptionTakesABurst(t *testing.T) {
	path := nettest.NewNS(t).Path()
	_, h := nettest.Netlink(t, path)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "burst0"}, PeerName: "burst1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	link, err := h.LinkByName("burst0")
	if err != nil {
		t.Fatal(err)
	}
	index := link.Attrs().Index

	s, err := drift.Subscribe(path, drift.Kinds{Links: true, Addrs: true}, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range burstAddrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 201, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}}
		if err := h.AddrAdd(link, addr); err != nil {
			t.Fatalf("add address %d: %v", i, err)
		}
	}
	state := newNetState()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(state.addrs[index]) < burstAddrs {
		select {
		case <-s.Ready():
		case <-ctx.Done():
			t.Fatalf("%d of %d addresses after 10s", len(state.addrs[index]), burstAddrs)
		}
		if err := apply(s, state); err != nil {
			t.Fatalf("after %d of %d addresses: %v", len(state.addrs[index]), burstAddrs, err)
		}
	}
}
