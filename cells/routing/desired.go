package routing

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"iter"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/nodes"
)

// TunnelDevice is the VXLAN device of --routing-mode=tunnel.
const TunnelDevice = "cellium_vxlan"

// tunnelVNI is the VXLAN network identifier of the tunnel, the same on
// every node.
const tunnelVNI = 2

// router keeps the routes, neighbors and fdb tables equal to what the
// nodes table asks for, and, in tunnel mode, the tunnel device in place.
type router struct {
	cfg       Config
	log       *slog.Logger
	db        *statedb.DB
	nodes     statedb.Table[*nodes.Node]
	devices   statedb.Table[*devices.Device]
	routes    statedb.RWTable[*Route]
	neighbors statedb.RWTable[*Neighbor]
	fdb       statedb.RWTable[*FDBEntry]
	nl        *Netlink
	repairs   *drift.Repairs

	initialized []func(statedb.WriteTxn)
	// tunnelIndex is the tunnel device's ifindex once made (0 before);
	// kernelChanged reads it.
	tunnelIndex atomic.Int64
	// linksUp and linksDown are the devices last seen up, and those seen
	// going down from up, by ifindex, from link updates (kernelChanged's
	// goroutine only).
	linksUp, linksDown map[int]bool
}

// desired is the routing state for a set of nodes.
type desired struct {
	routes    map[netip.Prefix]*Route
	neighbors map[netip.Addr]*Neighbor
	fdb       map[MAC]*FDBEntry
	// skipped are the nodes, or parts of them, that cannot be routed to.
	skipped []string
}

func (r *router) run(ctx context.Context, health cell.Health) error {
	health.OK("Waiting for the nodes table")
	if err := tables.WaitInitialized(ctx, r.db, r.nodes); err != nil {
		return nil // stopping
	}
	var lastSkipped []string
	for {
		txn := r.db.ReadTxn()
		all, nodesChanged := r.nodes.AllWatch(txn)
		_, devicesChanged := r.devices.AllWatch(txn)
		local, _ := nodes.LocalNode(txn, r.nodes)
		var retry <-chan time.Time
		want := r.desired(local, all)
		var err error
		switch {
		case r.cfg.RoutingMode == ModeNative:
			err = r.nl.removeTunnel()
		case len(want.routes) > 0:
			// Made once there is a node to reach: a single node needs none.
			err = r.ensureTunnel(txn, local)
		}
		if err != nil {
			health.Degraded("Tunnel device", err)
			retry = time.After(time.Second)
		} else {
			r.write(want)
			if !slices.Equal(want.skipped, lastSkipped) {
				for _, s := range want.skipped {
					r.log.Warn("No route to part of a node", "problem", s)
				}
				lastSkipped = want.skipped
			}
			health.OK(fmt.Sprintf("%s mode: %d routes", r.cfg.RoutingMode, len(want.routes)))
		}
		select {
		case <-nodesChanged:
		case <-devicesChanged:
		case <-retry:
		case <-ctx.Done():
			return nil
		}
	}
}

// ensureTunnel puts the tunnel device in place: VXLAN on --tunnel-port, no
// learning, this node's VTEP MAC (the one other nodes' neighbor entries
// give it: frames for another MAC would not be taken in), MTU the
// underlay's less the encapsulation. Without the local node yet, it waits.
func (r *router) ensureTunnel(txn statedb.ReadTxn, local *nodes.Node) error {
	if local == nil || !local.PrimaryIP().IsValid() {
		return fmt.Errorf("this node's address is not known yet (see the nodes module)")
	}
	ip, mtu := local.PrimaryIP(), 1500
	if dev := r.deviceOf(txn, ip); dev != nil {
		mtu = dev.MTU
	}
	st, err := r.nl.ensureTunnel(tunnelParams{port: r.cfg.TunnelPort, vni: tunnelVNI, mac: vtepMAC(ip), mtu: mtu - r.cfg.Overhead(ip.Is6())})
	if err != nil {
		return err
	}
	// A device made again, or set up again, has lost what the agent wrote
	// on it: the kernel removes a device's routes, neighbor and fdb entries
	// with it, and its IPv4 routes when it goes down, with no route event.
	prev := int(r.tunnelIndex.Swap(int64(st.index)))
	if prev == 0 || (st.index == prev && !st.setUp) {
		return nil
	}
	if st.created {
		r.repairs.Repaired("link", fmt.Sprintf("%s (VXLAN %d, UDP %d)", TunnelDevice, tunnelVNI, r.cfg.TunnelPort))
	} else if st.setUp {
		r.repairs.Repaired("link", TunnelDevice+" up")
	}
	r.refresh(func(dev string) bool { return dev == TunnelDevice })
	return nil
}

// deviceOf is the device that holds ip, nil for none.
func (r *router) deviceOf(txn statedb.ReadTxn, ip netip.Addr) *devices.Device {
	for d := range r.devices.All(txn) {
		for _, a := range d.Addrs {
			if a.Addr == ip {
				return d
			}
		}
	}
	return nil
}

// refresh has the reconcilers compare the rows whose device matches with
// the kernel again: what the kernel lacks is written back, and counted as
// a repair.
func (r *router) refresh(device func(string) bool) {
	r.routeRows().Refresh(func(x *Route) bool { return device(x.Device) })
	r.neighborRows().Refresh(func(x *Neighbor) bool { return device(x.Device) })
	r.fdbRows().Refresh(func(x *FDBEntry) bool { return device(x.Device) })
}

func (r *router) routeRows() drift.Rows[*Route] {
	return drift.Rows[*Route]{DB: r.db, Table: r.routes, Clone: (*Route).Clone, SetStatus: (*Route).withStatus, Status: (*Route).status}
}

func (r *router) neighborRows() drift.Rows[*Neighbor] {
	return drift.Rows[*Neighbor]{DB: r.db, Table: r.neighbors, Clone: (*Neighbor).Clone, SetStatus: (*Neighbor).withStatus, Status: (*Neighbor).status}
}

func (r *router) fdbRows() drift.Rows[*FDBEntry] {
	return drift.Rows[*FDBEntry]{DB: r.db, Table: r.fdb, Clone: (*FDBEntry).Clone, SetStatus: (*FDBEntry).withStatus, Status: (*FDBEntry).status}
}

// kernelChanged has the reconcilers compare with the kernel the rows that
// a batch of netlink updates may have undone: a route of the agent's
// deleted, or another written over it; a neighbor or fdb entry of the
// tunnel device deleted or changed; the rows on a device that went down
// and came up again (a device going down loses its IPv4 routes and
// neighbor entries, with no update of their own). Updates the agent's own
// writes cause match the rows, and are passed over. After lost updates,
// every row.
func (r *router) kernelChanged(_ context.Context, b drift.Batch) {
	if b.Resync {
		r.refresh(func(string) bool { return true })
		return
	}
	r.linksChanged(b.Links)
	routes := map[netip.Prefix][]netlink.RouteUpdate{}
	for _, u := range b.Routes {
		p, ok := prefixOf(u.Dst)
		if !ok || u.Table != unix.RT_TABLE_MAIN || (u.Type == unix.RTM_DELROUTE && !r.linkExists(u.LinkIndex)) {
			continue
		}
		routes[p] = append(routes[p], u)
	}
	if len(routes) > 0 {
		r.routeRows().Refresh(func(x *Route) bool {
			return slices.ContainsFunc(routes[x.Prefix], func(u netlink.RouteUpdate) bool {
				if u.Type == unix.RTM_DELROUTE {
					return u.Protocol == RouteProtocol
				}
				return u.Protocol != RouteProtocol || !u.Gw.Equal(x.Gateway.AsSlice())
			})
		})
	}
	tunnel := int(r.tunnelIndex.Load())
	neighs := map[netip.Addr][]netlink.NeighUpdate{}
	fdb := map[MAC][]netlink.NeighUpdate{}
	for _, u := range b.Neighbors {
		// An update of a device that is gone is passed over: the device's
		// return refreshes all of it.
		if tunnel == 0 || u.LinkIndex != tunnel || (u.Type == unix.RTM_DELNEIGH && !r.linkExists(u.LinkIndex)) {
			continue
		}
		if u.Family == unix.AF_BRIDGE {
			if len(u.HardwareAddr) == 6 {
				fdb[MAC(u.HardwareAddr)] = append(fdb[MAC(u.HardwareAddr)], u)
			}
		} else if ip, ok := netip.AddrFromSlice(u.IP); ok {
			neighs[ip.Unmap()] = append(neighs[ip.Unmap()], u)
		}
	}
	if len(neighs) > 0 {
		r.neighborRows().Refresh(func(x *Neighbor) bool {
			return slices.ContainsFunc(neighs[x.IP], func(u netlink.NeighUpdate) bool {
				return u.Type == unix.RTM_DELNEIGH || u.HardwareAddr.String() != x.MAC.String() || u.State&netlink.NUD_PERMANENT == 0
			})
		})
	}
	if len(fdb) > 0 {
		r.fdbRows().Refresh(func(x *FDBEntry) bool {
			return slices.ContainsFunc(fdb[x.MAC], func(u netlink.NeighUpdate) bool {
				// The agent replaces an entry by deleting the old
				// destination: only the loss of the wanted one counts.
				return u.IP.Equal(x.Dst.AsSlice()) == (u.Type == unix.RTM_DELNEIGH)
			})
		})
	}
}

// linksChanged refreshes the rows on each device that came up again after
// it was seen going down; a route without a device of its own (native
// mode) may have been through any of them.
func (r *router) linksChanged(links []netlink.LinkUpdate) {
	if r.linksUp == nil {
		r.linksUp, r.linksDown = map[int]bool{}, map[int]bool{}
	}
	for _, u := range links {
		i := int(u.Index)
		switch {
		case u.Header.Type == unix.RTM_DELLINK:
			delete(r.linksUp, i)
			delete(r.linksDown, i)
		case u.Flags&unix.IFF_UP == 0:
			r.linksDown[i] = r.linksDown[i] || r.linksUp[i]
			r.linksUp[i] = false
		default:
			r.linksUp[i] = true
			if r.linksDown[i] {
				delete(r.linksDown, i)
				name := u.Attrs().Name
				r.refresh(func(dev string) bool { return dev == name || dev == "" })
			}
		}
	}
}

// linkExists says whether the device of ifindex (0: none named) is there.
func (r *router) linkExists(ifindex int) bool {
	if ifindex == 0 {
		return true
	}
	_, err := r.nl.h.LinkByIndex(ifindex)
	return err == nil
}

// desired computes the routes, neighbors and fdb entries to the remote
// nodes. Tunnel: each remote pod CIDR is routed onlink through the tunnel
// device to a gateway address standing for the node's VTEP (the CIDR's
// first address), whose neighbor entry is the VTEP's MAC (derived from the
// node's address, the same on every node), whose fdb entry is the node's
// address. Native: each remote pod CIDR is routed via the node's address of
// its family.
func (r *router) desired(local *nodes.Node, all iter.Seq2[*nodes.Node, statedb.Revision]) desired {
	d := desired{routes: map[netip.Prefix]*Route{}, neighbors: map[netip.Addr]*Neighbor{}, fdb: map[MAC]*FDBEntry{}}
	var underlay netip.Addr
	if local != nil {
		underlay = local.PrimaryIP()
	}
	for n := range all {
		if n.Local || len(n.PodCIDRs) == 0 {
			continue
		}
		if r.cfg.RoutingMode == ModeTunnel {
			remote := n.IP(underlay)
			if !remote.IsValid() {
				d.skipped = append(d.skipped, fmt.Sprintf("node %s has no address of the underlay's family (%s)", n.Name, underlay))
				continue
			}
			mac := vtepMAC(remote)
			d.fdb[mac] = &FDBEntry{MAC: mac, Dst: remote, Device: TunnelDevice, Node: n.Name}
			for _, cidr := range n.PodCIDRs {
				gw := cidr.Addr()
				d.routes[cidr] = &Route{Prefix: cidr, Gateway: gw, Device: TunnelDevice, OnLink: true, Node: n.Name}
				d.neighbors[gw] = &Neighbor{IP: gw, MAC: mac, Device: TunnelDevice, Node: n.Name}
			}
			continue
		}
		for _, cidr := range n.PodCIDRs {
			gw := n.IP(cidr.Addr())
			if !gw.IsValid() {
				d.skipped = append(d.skipped, fmt.Sprintf("node %s: pod CIDR %s has no node address of its family to route via", n.Name, cidr))
				continue
			}
			d.routes[cidr] = &Route{Prefix: cidr, Gateway: gw, Node: n.Name}
		}
	}
	return d
}

// vtepMAC is the MAC address of the VTEP of the node at ip: locally
// administered, unicast, from the address (IPv4) or a hash of it (IPv6).
func vtepMAC(ip netip.Addr) MAC {
	m := MAC{0x0e, 0xce}
	if ip.Is4() {
		a := ip.As4()
		copy(m[2:], a[:])
		return m
	}
	h := fnv.New32a()
	a := ip.As16()
	h.Write(a[:])
	binary.BigEndian.PutUint32(m[2:], h.Sum32())
	return m
}

// write makes the tables equal to d: rows that differ (status aside) are
// written pending, rows not in d deleted; the first write marks the tables
// initialized, after which the reconcilers prune what the kernel has that
// d does not.
func (r *router) write(d desired) {
	txn := r.db.WriteTxn(r.routes, r.neighbors, r.fdb)
	defer txn.Commit()
	syncTable(txn, r.routes, RoutePrefix, d.routes, func(r *Route) netip.Prefix { return r.Prefix }, func(a, b *Route) bool {
		return a.Prefix == b.Prefix && a.Gateway == b.Gateway && a.Device == b.Device && a.OnLink == b.OnLink && a.Node == b.Node
	}, func(r *Route) *Route { r.Status = reconciler.StatusPending(); return r })
	syncTable(txn, r.neighbors, NeighborIP, d.neighbors, func(n *Neighbor) netip.Addr { return n.IP }, func(a, b *Neighbor) bool {
		return a.IP == b.IP && a.MAC == b.MAC && a.Device == b.Device && a.Node == b.Node
	}, func(n *Neighbor) *Neighbor { n.Status = reconciler.StatusPending(); return n })
	syncTable(txn, r.fdb, FDBMAC, d.fdb, func(f *FDBEntry) MAC { return f.MAC }, func(a, b *FDBEntry) bool {
		return a.MAC == b.MAC && a.Dst == b.Dst && a.Device == b.Device && a.Node == b.Node
	}, func(f *FDBEntry) *FDBEntry { f.Status = reconciler.StatusPending(); return f })
	for _, done := range r.initialized {
		done(txn)
	}
	r.initialized = nil
}

// syncTable makes tbl hold exactly want: what differs from the row there
// (by same) is inserted through pending, what want lacks is deleted.
func syncTable[K comparable, T any](txn statedb.WriteTxn, tbl statedb.RWTable[T], idx statedb.Index[T, K], want map[K]T,
	key func(T) K, same func(a, b T) bool, pending func(T) T) {
	for row := range tbl.All(txn) {
		if _, ok := want[key(row)]; !ok {
			tbl.Delete(txn, row)
		}
	}
	for k, w := range want {
		if have, _, found := tbl.Get(txn, idx.Query(k)); !found || !same(have, w) {
			tbl.Insert(txn, pending(w))
		}
	}
}
