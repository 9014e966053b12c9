package devcluster

import (
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/netnsrun"
)

// Outside is a network namespace on the cluster's bridge that is no node:
// it stands for the world outside the cluster (a server there plays the
// internet). It has no route to the pod ranges, so it can answer a pod only
// when the pod's node masqueraded the pod's traffic with its own address.
type Outside struct {
	// NetNS is the path of the namespace, "cellium-<name>.outside".
	NetNS string `json:"netns"`
	// IPv4 and IPv6 are its addresses on its eth0: 10.90.0.200 and
	// fd00:10:90::200, in the nodes' network.
	IPv4 netip.Addr `json:"ipv4"`
	IPv6 netip.Addr `json:"ipv6"`
}

// outsidePort is its port on the bridge.
const outsidePort = "outside"

// AddOutside makes the cluster's outside namespace, or returns the one it
// has. Down removes it with the rest.
func (c *Cluster) AddOutside() (Outside, error) {
	var out Outside
	err := c.update(func(s *state) error {
		if s.Outside != nil {
			out = *s.Outside
			return nil
		}
		o := Outside{
			NetNS: filepath.Join(netnsDir, "cellium-"+s.Name+".outside"),
			IPv4:  netip.MustParseAddr("10.90.0.200"),
			IPv6:  netip.MustParseAddr("fd00:10:90::200"),
		}
		// Recorded before it exists, so that Down removes what a failure
		// half way leaves.
		s.Outside = &o
		if err := s.save(); err != nil {
			return err
		}
		if err := makeOutside(s, o); err != nil {
			netnsrun.Remove(o.NetNS)
			s.Outside = nil
			return fmt.Errorf("outside namespace: %w", err)
		}
		out = o
		c.log.Info("Added the outside namespace", "netns", o.NetNS, "ipv4", o.IPv4, "ipv6", o.IPv6)
		return nil
	})
	return out, err
}

func makeOutside(s *state, o Outside) error {
	if err := netnsrun.Create(o.NetNS); err != nil {
		return err
	}
	fd, err := nsHandleOf(o.NetNS)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	err = netnsrun.WithHandle(s.BridgeNetNS, func(h *netlink.Handle) error {
		br, err := h.LinkByName(bridgeName)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", bridgeName, err)
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: outsidePort}, PeerName: "eth0", PeerNamespace: netlink.NsFd(fd)}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("create veth %s (eth0 in %s): %w", outsidePort, o.NetNS, err)
		}
		port, err := h.LinkByName(outsidePort)
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(port, br); err != nil {
			return fmt.Errorf("attach %s to %s: %w", outsidePort, bridgeName, err)
		}
		return h.LinkSetUp(port)
	})
	if err != nil {
		return err
	}
	// No default route and no route to the pods: only the nodes'
	// network is reachable, on link.
	return netnsrun.WithHandle(o.NetNS, func(h *netlink.Handle) error {
		eth0, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := addAddrs(h, eth0, o.IPv4, o.IPv6); err != nil {
			return err
		}
		return h.LinkSetUp(eth0)
	})
}
