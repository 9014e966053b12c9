package nettest_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/nettest"
)

// Two namespaces joined by a veth pair answer each other's pings; an
// address nobody has does not.
func TestPing(t *testing.T) {
	a, b := nettest.NewNS(t), nettest.NewNS(t)
	v4, v6 := nettest.Ranges(t)
	addrA4, addrB4 := v4.Addr().Next(), v4.Addr().Next().Next()
	addrA6, addrB6 := v6.Addr().Next(), v6.Addr().Next().Next()

	err := a.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "a"}, PeerName: "b", PeerNamespace: netlink.NsFd(int(b.Fd()))})
	})
	if err != nil {
		t.Fatal(err)
	}
	setup := func(n ns.NetNS, name string, ips ...netip.Addr) {
		err := n.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			for _, ip := range ips {
				a := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen()-8, ip.BitLen())}, Flags: unix.IFA_F_NODAD}
				if err := netlink.AddrAdd(l, a); err != nil {
					return err
				}
			}
			return netlink.LinkSetUp(l)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setup(a, "a", addrA4, addrA6)
	setup(b, "b", addrB4, addrB6)

	for _, dst := range []netip.Addr{addrB4, addrB6, netip.MustParseAddr("127.0.0.1")} {
		if err := nettest.Ping(a.Path(), dst, 5*time.Second); err != nil {
			t.Errorf("ping %s: %v", dst, err)
		}
	}
	if err := nettest.Ping(a.Path(), addrB4.Next(), 200*time.Millisecond); err == nil {
		t.Errorf("ping of an address nobody has succeeded")
	}
}
