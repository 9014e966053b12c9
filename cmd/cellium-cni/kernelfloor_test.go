package main

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// kernelFloor is what the kernel alone takes for what an ADD asks of it,
// for len(pods) pods at once in the node's namespace: for each, a veth
// pair into its fresh netns, a clsact qdisc on the host side, the host
// side's link-local and router addresses, the pod side up with its address,
// its route to the router and its default route, then the host side up
// with the host's route to the pod: the agent's calls for an IPv6 pod
// (cells/endpointmanager/veth.go), without the programs' two tc filters
// (which need the agent's programs). Each figure is one pod's, from
// opening its netns to its host route. The addresses are in prefix, the
// router its first; nothing is sent.
func kernelFloor(b *testing.B, nodeNS string, pods []*pod, prefix netip.Prefix) []time.Duration {
	node, err := netns.GetFromPath(nodeNS)
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	host, err := netlink.NewHandleAt(node, unix.NETLINK_ROUTE)
	if err != nil {
		b.Fatal(err)
	}
	defer host.Close()
	router := prefix.Addr().Next()
	return parallel(b, len(pods), func(i int) error {
		ip := router
		for range i + 1 {
			ip = ip.Next()
		}
		return kernelPlumb(host, pods[i].ns.Path(), fmt.Sprintf("kf%d", i), ip, router)
	})
}

func kernelPlumb(host *netlink.Handle, podNSPath, hostName string, ip, router netip.Addr) error {
	podNS, err := netns.GetFromPath(podNSPath)
	if err != nil {
		return err
	}
	defer podNS.Close()
	pod, err := netlink.NewHandleAt(podNS, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer pod.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName, MTU: 1500}, PeerName: "eth0", PeerNamespace: netlink.NsFd(podNS), PeerMTU: 1500}
	if err := host.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", hostName, err)
	}
	hostLink, err := host.LinkByName(hostName)
	if err != nil {
		return err
	}
	idx := hostLink.Attrs().Index
	if err := host.QdiscAdd(&netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}); err != nil {
		return fmt.Errorf("clsact on %s: %w", hostName, err)
	}
	mac := hostLink.Attrs().HardwareAddr
	ll := netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 8: mac[0] ^ 2, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]})
	if err := host.AddrReplace(hostLink, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(ll, 64)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("link-local address on %s: %w", hostName, err)
	}
	podLink, err := pod.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := pod.LinkSetUp(podLink); err != nil {
		return err
	}
	if err := pod.AddrReplace(podLink, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(ip, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s: %w", ip, err)
	}
	for _, r := range []*netlink.Route{
		{LinkIndex: podLink.Attrs().Index, Dst: ipNet(netip.PrefixFrom(router, 128))},
		{LinkIndex: podLink.Attrs().Index, Dst: ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0)), Gw: router.AsSlice()},
	} {
		if err := pod.RouteReplace(r); err != nil {
			return fmt.Errorf("pod route %s: %w", r.Dst, err)
		}
	}
	if err := host.AddrReplace(hostLink, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(router, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("router address on %s: %w", hostName, err)
	}
	if err := host.LinkSetUp(hostLink); err != nil {
		return err
	}
	if err := host.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(ip, 128))}); err != nil {
		return fmt.Errorf("host route to %s: %w", ip, err)
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
