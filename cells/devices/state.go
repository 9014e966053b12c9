package devices

import (
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netState is the agent's copy of the namespace's links and addresses, as
// netlink reported them. Links and addresses arrive on separate sockets, so
// an address may come before its link: addresses are kept per interface
// index whether or not the link is known yet, and a device row exists only
// once both are.
type netState struct {
	links map[int]*Device
	addrs map[int][]DeviceAddress
	// changed are the interface indexes whose rows need writing.
	changed map[int]struct{}
}

func newNetState() *netState {
	return &netState{links: map[int]*Device{}, addrs: map[int][]DeviceAddress{}, changed: map[int]struct{}{}}
}

func (s *netState) setLink(l netlink.Link) {
	a := l.Attrs()
	s.links[a.Index] = &Device{
		Index:        a.Index,
		Name:         a.Name,
		Type:         l.Type(),
		HardwareAddr: HardwareAddr(slices.Clone(a.HardwareAddr)),
		MTU:          a.MTU,
		Flags:        a.Flags,
	}
	s.changed[a.Index] = struct{}{}
}

func (s *netState) deleteLink(index int) {
	delete(s.links, index)
	delete(s.addrs, index)
	s.changed[index] = struct{}{}
}

// appendAddr adds an address of a listing, which comes in the kernel's
// order.
func (s *netState) appendAddr(index int, a DeviceAddress) {
	s.addrs[index] = append(s.addrs[index], a)
	s.changed[index] = struct{}{}
}

// setAddr adds an address where the kernel puts it, or updates it in
// place. Keeping the kernel's order means a device's addresses, and so its
// primary ones, read the same whether they were learned one update at a
// time or from a listing after a restart.
func (s *netState) setAddr(index int, a DeviceAddress) {
	addrs := slices.Clone(s.addrs[index])
	if i := slices.IndexFunc(addrs, a.sameAs); i >= 0 {
		if addrs[i].Secondary == a.Secondary {
			addrs[i] = a
			s.addrs[index] = addrs
			s.changed[index] = struct{}{}
			return
		}
		// A promoted secondary moves among the primaries.
		addrs = slices.Delete(addrs, i, i+1)
	}
	s.addrs[index] = slices.Insert(addrs, kernelPosition(addrs, a), a)
	s.changed[index] = struct{}{}
}

// kernelPosition is where the kernel lists a new address a among addrs: IPv4
// before IPv6 (the order of a dump). IPv4 primaries come by scope, host
// before link before global, oldest first within a scope, and secondaries
// after all of them. IPv6 addresses come by scope, global first, and newest
// first within a scope.
func kernelPosition(addrs []DeviceAddress, a DeviceAddress) int {
	firstIPv6 := slices.IndexFunc(addrs, func(b DeviceAddress) bool { return b.Addr.Is6() })
	if firstIPv6 < 0 {
		firstIPv6 = len(addrs)
	}
	switch {
	case a.Addr.Is4() && a.Secondary:
		return firstIPv6
	case a.Addr.Is4():
		pos := 0
		for i, b := range addrs[:firstIPv6] {
			if !b.Secondary && a.Scope <= b.Scope {
				pos = i + 1
			}
		}
		return pos
	}
	for i, b := range addrs[firstIPv6:] {
		if ipv6SourceScope(a.Addr) >= ipv6SourceScope(b.Addr) {
			return firstIPv6 + i
		}
	}
	return len(addrs)
}

// ipv6SourceScope ranks an IPv6 address's scope as the kernel does when it
// orders a device's addresses: wider scopes rank higher.
func ipv6SourceScope(a netip.Addr) int {
	switch {
	case a.IsLoopback():
		return 1
	case a.IsLinkLocalUnicast():
		return 2
	case siteLocal.Contains(a):
		return 5
	}
	return 14
}

// siteLocal is the deprecated IPv6 site-local range (RFC 3879).
var siteLocal = netip.MustParsePrefix("fec0::/10")

func (s *netState) deleteAddr(index int, a DeviceAddress) {
	addrs := s.addrs[index]
	if i := slices.IndexFunc(addrs, a.sameAs); i >= 0 {
		addrs = slices.Delete(slices.Clone(addrs), i, i+1)
		if len(addrs) == 0 {
			delete(s.addrs, index)
		} else {
			s.addrs[index] = addrs
		}
		s.changed[index] = struct{}{}
	}
}

// sameAs reports whether a and b are the same kernel address: IPv4 allows
// one address twice with different prefix lengths.
func (a DeviceAddress) sameAs(b DeviceAddress) bool {
	return a.Addr == b.Addr && a.PrefixLen == b.PrefixLen
}

// deviceAddress converts a netlink address, or reports false for one that
// is not an IP address.
func deviceAddress(ipnet net.IPNet, flags, scope int) (DeviceAddress, bool) {
	addr, ok := netip.AddrFromSlice(ipnet.IP)
	if !ok {
		return DeviceAddress{}, false
	}
	addr = addr.Unmap()
	ones, _ := ipnet.Mask.Size()
	return DeviceAddress{
		Addr:      addr,
		PrefixLen: ones,
		Scope:     Scope(scope),
		// IFA_F_SECONDARY means "temporary" for IPv6.
		Secondary: addr.Is4() && flags&unix.IFA_F_SECONDARY != 0,
	}, true
}

// device is the row for index, or nil if there is none.
func (s *netState) device(index int, sel selector) *Device {
	link, ok := s.links[index]
	if !ok {
		return nil
	}
	d := *link
	d.Addrs = s.addrs[index]
	d.Selected = sel.selected(&d)
	return &d
}

// nodeAddresses are the global unicast addresses of the selected devices.
func (s *netState) nodeAddresses(sel selector) map[netip.Addr]*NodeAddress {
	out := map[netip.Addr]*NodeAddress{}
	for _, index := range slices.Sorted(maps.Keys(s.links)) {
		d := s.device(index, sel)
		if !d.Selected {
			continue
		}
		var seen4, seen6 bool
		for _, a := range d.Addrs {
			if !a.isNodeAddress() {
				continue
			}
			seen := &seen6
			if a.Addr.Is4() {
				seen = &seen4
			}
			primary := !*seen
			*seen = true
			if _, dup := out[a.Addr]; !dup {
				out[a.Addr] = &NodeAddress{Addr: a.Addr, Device: d.Name, Primary: primary}
			}
		}
	}
	return out
}

// write brings the tables in line with the state: the rows of the changed
// devices, or of every device if all is set (after a fresh listing, rows of
// devices that went away meanwhile are found only that way), and every node
// address. Rows that would not change are left alone, so watchers wake only
// for real changes.
func (s *netState) write(txn statedb.WriteTxn, sel selector, devices statedb.RWTable[*Device], addrs statedb.RWTable[*NodeAddress], all bool) error {
	if all {
		for d := range devices.All(txn) {
			s.changed[d.Index] = struct{}{}
		}
		for index := range s.links {
			s.changed[index] = struct{}{}
		}
	}
	for index := range s.changed {
		old, _, found := devices.Get(txn, DeviceIfIndex.Query(index))
		d := s.device(index, sel)
		var err error
		switch {
		case d == nil && found:
			_, _, err = devices.Delete(txn, old)
		case d != nil && (!found || !equalDevices(old, d)):
			_, _, err = devices.Insert(txn, d)
		}
		if err != nil {
			return err
		}
	}
	clear(s.changed)

	want := s.nodeAddresses(sel)
	// Deleting only after the iteration: the iterator reads the indexes
	// this transaction modifies.
	var gone []*NodeAddress
	for a := range addrs.All(txn) {
		w, ok := want[a.Addr]
		switch {
		case !ok:
			gone = append(gone, a)
		case *w == *a:
			delete(want, a.Addr)
		}
	}
	for _, a := range gone {
		if _, _, err := addrs.Delete(txn, a); err != nil {
			return err
		}
	}
	for _, a := range want {
		if _, _, err := addrs.Insert(txn, a); err != nil {
			return err
		}
	}
	return nil
}

func equalDevices(a, b *Device) bool {
	return a.Index == b.Index && a.Name == b.Name && a.Type == b.Type &&
		slices.Equal(a.HardwareAddr, b.HardwareAddr) && a.MTU == b.MTU && a.Flags == b.Flags &&
		slices.Equal(a.Addrs, b.Addrs) && a.Selected == b.Selected
}
