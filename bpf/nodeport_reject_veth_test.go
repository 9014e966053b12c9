package bpf_test

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/nettest"
)

// TestNodePortRejectOnTheWire: a client in a namespace of its own, behind
// a veth, connecting to a frontend without backends on the other end,
// where the ingress program is attached, is refused at once: TCP connect
// and a connected UDP socket's read fail with ECONNREFUSED, where before
// the connect hung until the client's timeout. The frontend is an address
// the node does not have, so only the program can answer.
func TestNodePortRejectOnTheWire(t *testing.T) {
	n := loadNodePort(t)
	node, clientNS := nettest.NewNS(t), nettest.NewNS(t)
	external := netip.MustParseAddr("10.90.0.50")
	tcpFE := netip.AddrPortFrom(external, 30081)
	udpFE := netip.AddrPortFrom(external, 30053)
	n.service(tcpFE, lbmap.TCP)
	n.service(udpFE, lbmap.UDP)

	err := nettest.Do(node.Path(), func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "np0"}, PeerName: "np0c"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		peer, err := netlink.LinkByName("np0c")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(clientNS.Fd())); err != nil {
			return err
		}
		dev, err := netlink.LinkByName("np0")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr(nodeAddr.String() + "/24")
		if err := netlink.AddrAdd(dev, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(dev); err != nil {
			return err
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: dev.Attrs().Index, Program: n.ingress, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	if err != nil {
		t.Fatalf("node side: %v", err)
	}
	err = nettest.Do(clientNS.Path(), func() error {
		dev, err := netlink.LinkByName("np0c")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr(client.Addr().String() + "/24")
		if err := netlink.AddrAdd(dev, addr); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(dev); err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: dev.Attrs().Index,
			Dst: &net.IPNet{IP: external.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: nodeAddr.AsSlice()})
	})
	if err != nil {
		t.Fatalf("client side: %v", err)
	}

	// Longer than any answer takes, far shorter than a client's own
	// connect timeout.
	const wait = 5 * time.Second
	err = nettest.Do(clientNS.Path(), func() error {
		conn, err := net.DialTimeout("tcp", tcpFE.String(), wait)
		if err == nil {
			conn.Close()
		}
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("TCP connect to %v without backends: %v, want ECONNREFUSED", tcpFE, err)
	}

	err = nettest.Do(clientNS.Path(), func() error {
		conn, err := net.Dial("udp", udpFE.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("query")); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(wait))
		_, err = conn.Read(make([]byte, 16))
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to %v without backends: %v, want ECONNREFUSED", udpFE, err)
	}
}
