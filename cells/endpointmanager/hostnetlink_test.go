package endpointmanager_test

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// TestCreationsShareHostNetlinkSocket: the host's routes to three new
// endpoints, one after another, are written through one netlink socket
// (the kernel names the socket whose request made a route in its
// notification): the creations share the agent's host-side sockets,
// where netlink's package functions opened and closed a socket for every
// request.
func TestCreationsShareHostNetlinkSocket(t *testing.T) {
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{})
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
	if err != nil {
		t.Fatalf("subscribe to route updates: %v", err)
	}
	defer s.Close()
	if err := s.SetReceiveTimeout(&unix.Timeval{Sec: 10}); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]bool{}
	for range 3 {
		ep := n.create(t, newPod(t))
		want[ep.IPv4], want[ep.IPv6] = true, true
	}
	// The socket each host route came from.
	senders := map[uint32][]netip.Addr{}
	for len(want) > 0 {
		msgs, _, err := s.Receive()
		if err != nil {
			t.Fatalf("route updates: %v; the host routes to %v not seen", err, want)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.RTM_NEWROUTE || len(m.Data) < unix.SizeofRtMsg {
				continue
			}
			attrs, err := nl.ParseRouteAttr(m.Data[unix.SizeofRtMsg:])
			if err != nil {
				t.Fatalf("route update: %v", err)
			}
			for _, a := range attrs {
				dst, ok := netip.AddrFromSlice(a.Value)
				if a.Attr.Type != unix.RTA_DST || !ok || !want[dst.Unmap()] {
					continue
				}
				delete(want, dst.Unmap())
				senders[m.Header.Pid] = append(senders[m.Header.Pid], dst.Unmap())
			}
		}
	}
	if len(senders) != 1 {
		t.Fatalf("the host routes to 3 endpoints came from %d sockets (by port ID: %v), want 1", len(senders), senders)
	}
	for pid := range senders {
		if pid == 0 {
			t.Fatalf("the host routes came from port ID 0 (the kernel), want the agent's socket")
		}
	}
}
