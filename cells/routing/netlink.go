package routing

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net"
	"net/netip"
	"syscall"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/drift"
)

// RouteProtocol marks the routes the agent owns (`ip route` shows it as
// proto 201): prune deletes those the table lacks, and never touches
// anyone else's.
const RouteProtocol = 201

// Netlink is the routing cell's netlink handle, in the namespace whose
// devices the devices cell watches (--devices-netns; the agent's own by
// default).
type Netlink struct {
	path string
	h    *netlink.Handle
}

func newNetlink(lc cell.Lifecycle, cfg devices.Config) *Netlink {
	nl := &Netlink{path: cfg.DevicesNetns}
	lc.Append(cell.Hook{OnStart: nl.open, OnStop: nl.close})
	return nl
}

func (nl *Netlink) close(cell.HookContext) error {
	if nl.h != nil {
		nl.h.Close()
	}
	return nil
}

func (nl *Netlink) open(cell.HookContext) error {
	if nl.path == "" {
		h, err := netlink.NewHandle()
		nl.h = h
		return err
	}
	ns, err := netns.GetFromPath(nl.path)
	if err != nil {
		return fmt.Errorf("--devices-netns %s: %w", nl.path, err)
	}
	defer ns.Close()
	nl.h, err = netlink.NewHandleAt(ns)
	return err
}

type tunnelParams struct {
	port uint16
	vni  int
	mac  MAC
	mtu  int
}

// tunnelState is what ensureTunnel found and did.
type tunnelState struct {
	// index is the device's ifindex: a new one is a new device, which has
	// none of the routes, neighbor and fdb entries of the one before.
	index int
	// created: the device was made; setUp: it was down and was set up
	// (setting a device down flushes its IPv4 routes, with no event).
	created, setUp bool
}

// ensureTunnel makes the tunnel device exist with p, up; a device of that
// name that differs in kind, VNI or port is made again, one that differs
// in MTU only is changed in place.
func (nl *Netlink) ensureTunnel(p tunnelParams) (tunnelState, error) {
	var st tunnelState
	link, err := nl.h.LinkByName(TunnelDevice)
	if err == nil {
		if vx, ok := link.(*netlink.Vxlan); !ok || vx.VxlanId != p.vni || vx.Port != int(p.port) || vx.Learning {
			if err := nl.h.LinkDel(link); err != nil {
				return st, fmt.Errorf("remove %s to make it again: %w", TunnelDevice, err)
			}
			link = nil
		}
	} else if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return st, fmt.Errorf("look up %s: %w", TunnelDevice, err)
	} else {
		link = nil
	}
	if link == nil {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: TunnelDevice, MTU: p.mtu, HardwareAddr: p.mac[:]}, VxlanId: p.vni, Port: int(p.port), Learning: false}
		if err := nl.h.LinkAdd(vx); err != nil {
			return st, fmt.Errorf("create %s (VXLAN %d, UDP %d): %w", TunnelDevice, p.vni, p.port, err)
		}
		if link, err = nl.h.LinkByName(TunnelDevice); err != nil {
			return st, err
		}
		st.created = true
	}
	if link.Attrs().HardwareAddr.String() != p.mac.String() {
		if err := nl.h.LinkSetHardwareAddr(link, p.mac[:]); err != nil {
			return st, fmt.Errorf("set the MAC address of %s to %s: %w", TunnelDevice, p.mac, err)
		}
	}
	if link.Attrs().MTU != p.mtu {
		if err := nl.h.LinkSetMTU(link, p.mtu); err != nil {
			return st, fmt.Errorf("set the MTU of %s to %d: %w", TunnelDevice, p.mtu, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := nl.h.LinkSetUp(link); err != nil {
			return st, fmt.Errorf("set %s up: %w", TunnelDevice, err)
		}
		st.setUp = true
	}
	st.index = link.Attrs().Index
	return st, nil
}

// removeTunnel removes a tunnel device a run in tunnel mode left.
func (nl *Netlink) removeTunnel() error {
	link, err := nl.h.LinkByName(TunnelDevice)
	if err != nil {
		return nil
	}
	return nl.h.LinkDel(link)
}

// ifindex is the index of the device dev; 0 for "".
func (nl *Netlink) ifindex(dev string) (int, error) {
	if dev == "" {
		return 0, nil
	}
	link, err := nl.h.LinkByName(dev)
	if err != nil {
		return 0, fmt.Errorf("device %s: %w", dev, err)
	}
	return link.Attrs().Index, nil
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// routeOps write routes into the main table.
type routeOps struct {
	nl      *Netlink
	repairs *drift.Repairs
}

func (o *routeOps) kernel(r *Route) (*netlink.Route, error) {
	ifindex, err := o.nl.ifindex(r.Device)
	if err != nil {
		return nil, err
	}
	k := &netlink.Route{Dst: ipNet(r.Prefix), Gw: r.Gateway.AsSlice(), LinkIndex: ifindex, Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if r.OnLink {
		k.Flags = int(netlink.FLAG_ONLINK)
	}
	return k, nil
}

// ours are the agent's routes of a family in the main table.
func (o *routeOps) ours(fam int) ([]netlink.Route, error) {
	return o.nl.h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: RouteProtocol},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
}

func (o *routeOps) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, r *Route) error {
	batch := []reconciler.BatchEntry[*Route]{{Object: r, Revision: rev}}
	o.UpdateBatch(ctx, txn, batch)
	return batch[0].Result
}

// UpdateBatch writes the routes that the kernel does not have as they are,
// after one listing of the agent's routes: a route already right is not
// written again (a restart rewrites nothing), and a batch of N routes
// costs one dump, not N.
func (o *routeOps) UpdateBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*Route]) {
	have := map[netip.Prefix][]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := o.ours(fam)
		if err != nil {
			for i := range batch {
				batch[i].Result = fmt.Errorf("list routes: %w", err)
			}
			return
		}
		for _, k := range routes {
			if p, ok := prefixOf(k.Dst); ok {
				have[p] = append(have[p], k)
			}
		}
	}
	for i := range batch {
		batch[i].Result = o.update(batch[i].Object, have[batch[i].Object.Prefix])
	}
}

func (o *routeOps) update(r *Route, have []netlink.Route) error {
	want, err := o.kernel(r)
	if err != nil {
		return err
	}
	for _, h := range have {
		if h.Gw.Equal(want.Gw) && (want.LinkIndex == 0 || h.LinkIndex == want.LinkIndex) &&
			(h.Flags&int(netlink.FLAG_ONLINK) != 0) == r.OnLink {
			return nil
		}
	}
	if err := o.nl.h.RouteReplace(want); err != nil {
		return fmt.Errorf("route %s via %s: %w", r.Prefix, r.Gateway, err)
	}
	if drift.IsRepair(r.Status) {
		o.repairs.Repaired("route", r.String())
	}
	return nil
}

func (o *routeOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *Route) error {
	err := o.nl.h.RouteDel(&netlink.Route{Dst: ipNet(r.Prefix), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN})
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("delete route %s: %w", r.Prefix, err)
	}
	return nil
}

func (o *routeOps) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*Route]) {
	for i := range batch {
		batch[i].Result = o.Delete(ctx, txn, batch[i].Revision, batch[i].Object)
	}
}

func (o *routeOps) Prune(_ context.Context, _ statedb.ReadTxn, rows iter.Seq2[*Route, statedb.Revision]) error {
	want := map[netip.Prefix]bool{}
	for r := range rows {
		want[r.Prefix] = true
	}
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := o.ours(fam)
		if err != nil {
			return err
		}
		for _, k := range routes {
			p, ok := prefixOf(k.Dst)
			if ok && want[p] {
				continue
			}
			if err := o.nl.h.RouteDel(&k); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("delete stale route %s: %w", k.Dst, err))
			}
		}
	}
	return errors.Join(errs...)
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), ok
}

// neighborOps write permanent neighbor entries on the tunnel device.
type neighborOps struct {
	nl      *Netlink
	repairs *drift.Repairs
}

func (o *neighborOps) kernel(n *Neighbor) (*netlink.Neigh, error) {
	ifindex, err := o.nl.ifindex(n.Device)
	if err != nil {
		return nil, err
	}
	return &netlink.Neigh{LinkIndex: ifindex, Family: family(n.IP), State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: n.MAC[:]}, nil
}

func (o *neighborOps) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, n *Neighbor) error {
	batch := []reconciler.BatchEntry[*Neighbor]{{Object: n, Revision: rev}}
	o.UpdateBatch(ctx, txn, batch)
	return batch[0].Result
}

// UpdateBatch writes the entries the device does not have as they are,
// after one listing per device and family.
func (o *neighborOps) UpdateBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*Neighbor]) {
	type list struct{ ifindex, family int }
	lists := map[list][]netlink.Neigh{}
	for i := range batch {
		n := batch[i].Object
		want, err := o.kernel(n)
		if err != nil {
			batch[i].Result = err
			continue
		}
		key := list{want.LinkIndex, want.Family}
		have, listed := lists[key]
		if !listed {
			if have, err = o.nl.h.NeighList(want.LinkIndex, want.Family); err != nil {
				batch[i].Result = fmt.Errorf("list neighbors of %s: %w", n.Device, err)
				continue
			}
			lists[key] = have
		}
		batch[i].Result = o.update(n, want, have)
	}
}

func (o *neighborOps) update(n *Neighbor, want *netlink.Neigh, have []netlink.Neigh) error {
	for _, h := range have {
		if h.IP.Equal(want.IP) && h.HardwareAddr.String() == n.MAC.String() && h.State&netlink.NUD_PERMANENT != 0 {
			return nil
		}
	}
	if err := o.nl.h.NeighSet(want); err != nil {
		return fmt.Errorf("neighbor %s: %w", n, err)
	}
	if drift.IsRepair(n.Status) {
		o.repairs.Repaired("neigh", n.String())
	}
	return nil
}

func (o *neighborOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, n *Neighbor) error {
	k, err := o.kernel(n)
	if err != nil {
		return nil // no device, no neighbor
	}
	if err := o.nl.h.NeighDel(k); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete neighbor %s: %w", n.IP, err)
	}
	return nil
}

func (o *neighborOps) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*Neighbor]) {
	for i := range batch {
		batch[i].Result = o.Delete(ctx, txn, batch[i].Revision, batch[i].Object)
	}
}

func (o *neighborOps) Prune(_ context.Context, _ statedb.ReadTxn, rows iter.Seq2[*Neighbor, statedb.Revision]) error {
	ifindex, err := o.nl.ifindex(TunnelDevice)
	if err != nil {
		return nil // no tunnel device: nothing of ours
	}
	want := map[netip.Addr]bool{}
	for n := range rows {
		want[n.IP] = true
	}
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := o.nl.h.NeighList(ifindex, fam)
		if err != nil {
			return err
		}
		for _, h := range have {
			ip, ok := netip.AddrFromSlice(h.IP)
			if !ok || h.State&netlink.NUD_PERMANENT == 0 || want[ip.Unmap()] {
				continue
			}
			if err := o.nl.h.NeighDel(&h); err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("delete stale neighbor %s: %w", h.IP, err))
			}
		}
	}
	return errors.Join(errs...)
}

// fdbOps write the tunnel device's forwarding entries: a VTEP's MAC to its
// node's address.
type fdbOps struct {
	nl      *Netlink
	repairs *drift.Repairs
}

func (o *fdbOps) kernel(f *FDBEntry) (*netlink.Neigh, error) {
	ifindex, err := o.nl.ifindex(f.Device)
	if err != nil {
		return nil, err
	}
	return &netlink.Neigh{LinkIndex: ifindex, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF,
		IP: f.Dst.AsSlice(), HardwareAddr: f.MAC[:]}, nil
}

func (o *fdbOps) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, f *FDBEntry) error {
	batch := []reconciler.BatchEntry[*FDBEntry]{{Object: f, Revision: rev}}
	o.UpdateBatch(ctx, txn, batch)
	return batch[0].Result
}

// UpdateBatch writes the entries the device does not have as they are,
// after one listing per device.
func (o *fdbOps) UpdateBatch(_ context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*FDBEntry]) {
	lists := map[int][]netlink.Neigh{}
	for i := range batch {
		f := batch[i].Object
		want, err := o.kernel(f)
		if err != nil {
			batch[i].Result = err
			continue
		}
		have, listed := lists[want.LinkIndex]
		if !listed {
			if have, err = o.nl.h.NeighList(want.LinkIndex, unix.AF_BRIDGE); err != nil {
				batch[i].Result = fmt.Errorf("list fdb entries of %s: %w", f.Device, err)
				continue
			}
			lists[want.LinkIndex] = have
		}
		batch[i].Result = o.update(f, want, have)
	}
}

func (o *fdbOps) update(f *FDBEntry, want *netlink.Neigh, have []netlink.Neigh) error {
	for _, h := range have {
		if h.HardwareAddr.String() == f.MAC.String() && h.IP.Equal(want.IP) {
			return nil
		}
	}
	// One destination per MAC: a node whose address changed replaces its
	// entry.
	for _, h := range have {
		if h.HardwareAddr.String() == f.MAC.String() {
			o.nl.h.NeighDel(&h)
		}
	}
	if err := o.nl.h.NeighAppend(want); err != nil {
		return fmt.Errorf("fdb %s: %w", f, err)
	}
	if drift.IsRepair(f.Status) {
		o.repairs.Repaired("fdb", f.String())
	}
	return nil
}

func (o *fdbOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, f *FDBEntry) error {
	k, err := o.kernel(f)
	if err != nil {
		return nil
	}
	if err := o.nl.h.NeighDel(k); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete fdb entry %s: %w", f.MAC, err)
	}
	return nil
}

func (o *fdbOps) DeleteBatch(ctx context.Context, txn statedb.ReadTxn, batch []reconciler.BatchEntry[*FDBEntry]) {
	for i := range batch {
		batch[i].Result = o.Delete(ctx, txn, batch[i].Revision, batch[i].Object)
	}
}

func (o *fdbOps) Prune(_ context.Context, _ statedb.ReadTxn, rows iter.Seq2[*FDBEntry, statedb.Revision]) error {
	ifindex, err := o.nl.ifindex(TunnelDevice)
	if err != nil {
		return nil
	}
	want := map[string]bool{}
	for f := range rows {
		want[f.MAC.String()+"/"+f.Dst.String()] = true
	}
	have, err := o.nl.h.NeighList(ifindex, unix.AF_BRIDGE)
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range have {
		ip, ok := netip.AddrFromSlice(h.IP)
		if !ok || h.State&netlink.NUD_PERMANENT == 0 || want[h.HardwareAddr.String()+"/"+ip.Unmap().String()] {
			continue
		}
		if err := o.nl.h.NeighDel(&h); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("delete stale fdb entry %s: %w", h.HardwareAddr, err))
		}
	}
	return errors.Join(errs...)
}
