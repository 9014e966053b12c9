package devcluster

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/netnsrun"
)

// bridgeName is the bridge in the cluster's bridge namespace; its ports are
// named after the nodes.
const bridgeName = "br0"

// nodeNetworkBits is the prefix length of the nodes' network of a's family:
// 10.90.0.0/24 and fd00:10:90::/64.
func nodeNetworkBits(a netip.Addr) int {
	if a.Is6() {
		return 64
	}
	return 24
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// addAddrs puts addrs on link, with the nodes' network's prefix length.
// IPv6 addresses skip duplicate address detection: usable at once, and
// nobody else is on the bridge.
func addAddrs(h *netlink.Handle, link netlink.Link, addrs ...netip.Addr) error {
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, nodeNetworkBits(a)))}
		if a.Is6() {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add %s to %s: %w", a, link.Attrs().Name, err)
		}
	}
	return nil
}

func blackholeRoute(p netip.Prefix) *netlink.Route {
	family := netlink.FAMILY_V4
	if p.Addr().Is6() {
		family = netlink.FAMILY_V6
	}
	return &netlink.Route{Dst: ipNet(p), Type: unix.RTN_BLACKHOLE, Family: family}
}

// setupBridge makes the bridge in the bridge namespace, with the gateway
// addresses and blackhole default routes: whatever a node sends that is not
// for another node ends here.
func setupBridge(s *state) error {
	return netnsrun.WithHandle(s.BridgeNetNS, func(h *netlink.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("create bridge %s: %w", bridgeName, err)
		}
		if err := addAddrs(h, br, s.Gateway4, s.Gateway6); err != nil {
			return err
		}
		if err := h.LinkSetUp(br); err != nil {
			return fmt.Errorf("set bridge %s up: %w", bridgeName, err)
		}
		for _, def := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
			if err := h.RouteAdd(blackholeRoute(def)); err != nil {
				return fmt.Errorf("blackhole default route %s in the bridge namespace: %w", def, err)
			}
		}
		return nil
	})
}

// setupNode joins the node's namespace to the bridge: a veth pair, eth0 in
// the node and a bridge port named after it. The node's default route goes
// to the bridge namespace; the pod and service ranges are blackholed, so
// what no agent routes or translates is dropped in the node.
func setupNode(s *state, n *Node) error {
	nodeNS, err := nsHandleOf(n.NetNS)
	if err != nil {
		return err
	}
	defer unix.Close(nodeNS)
	err = netnsrun.WithHandle(s.BridgeNetNS, func(h *netlink.Handle) error {
		br, err := h.LinkByName(bridgeName)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", bridgeName, err)
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n.Name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(nodeNS)}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth %s (eth0 in %s): %w", n.Name, n.NetNS, err)
		}
		port, err := h.LinkByName(n.Name)
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(port, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", n.Name, bridgeName, err)
		}
		return h.LinkSetUp(port)
	})
	if err != nil {
		return err
	}
	return netnsrun.WithHandle(n.NetNS, func(h *netlink.Handle) error {
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := addAddrs(h, eth0, n.IPv4, n.IPv6); err != nil {
			return err
		}
		if err := h.LinkSetUp(eth0); err != nil {
			return fmt.Errorf("set eth0 up: %w", err)
		}
		for _, gw := range []netip.Addr{s.Gateway4, s.Gateway6} {
			r := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}
			if err := h.RouteAdd(r); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		for _, p := range append(append([]netip.Prefix{}, podRanges...), serviceRanges...) {
			if err := h.RouteAdd(blackholeRoute(p)); err != nil {
				return fmt.Errorf("blackhole route %s: %w", p, err)
			}
		}
		return nil
	})
}

// nsHandleOf opens the namespace at path; the caller closes the fd.
func nsHandleOf(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	return fd, nil
}
