package devices

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/pkg/nettest"
)

// burstAddrs is how many addresses TestSubscriptionTakesABurst adds while
// nothing receives: more than the subscription takes without
// drift.SocketBuffer (64 in each channel, the rest in a socket buffer of
// net.core.rmem_default, 208 KiB), and than the 1,024 a channel held
// before.
const burstAddrs = 1500

// TestSubscriptionTakesABurst: link and address changes made while a batch
// is written (many pods' veths created at once) wait in the kernel's
// socket buffer and are all received after it; the subscription does not
// end with "no buffer space", which costs a new listing of everything.
func TestSubscriptionTakesABurst(t *testing.T) {
	ns, h := nettest.Netlink(t, nettest.NewNS(t).Path())
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "burst0"}, PeerName: "burst1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	link, err := h.LinkByName("burst0")
	if err != nil {
		t.Fatal(err)
	}
	index := link.Attrs().Index

	s := &subscription{log: slog.New(slog.DiscardHandler), done: make(chan struct{})}
	if err := s.start(ns); err != nil {
		t.Fatal(err)
	}
	defer s.close()
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
		if err := s.receiveBatch(ctx, state, true); err != nil {
			t.Fatalf("after %d of %d addresses: %v", len(state.addrs[index]), burstAddrs, err)
		}
	}
}
