package nodes

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"reflect"
	"slices"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/ipam"
)

// localNode describes this node: its addresses (--node-ip, else those of
// the device holding the default route) and its pod CIDRs (the IPAM's
// pools), and the health endpoints' addresses: again whenever what it
// reads changes (a default route, the row or node addresses of a device
// holding one, a health endpoint), not for each pod's endpoint or veth.
type localNode struct {
	log        *slog.Logger
	nodes      *nodes
	ipam       *ipam.IPAM
	configured []netip.Addr
	devices    statedb.Table[*devices.Device]
	addrs      statedb.Table[*devices.NodeAddress]
	// endpoints give the health endpoint's addresses.
	endpoints statedb.Table[*endpointmanager.Endpoint]
	// netnsPath is --devices-netns: the namespace whose routes count.
	netnsPath string
	// metrics count the listings of the default routes and the
	// computations of the spec.
	metrics localMetrics
}

func (l *localNode) run(ctx context.Context, health cell.Health) error {
	if err := l.ipam.WaitReady(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	handle, ns, err := l.handle()
	if err != nil {
		return err
	}
	defer handle.Close()
	if ns != nil {
		defer ns.Close()
	}
	// Only the default routes of the main table can change the answer:
	// the others (pods' routes, which come by the hundred during a burst
	// of ADDs) are not even queued for this job. The subscription is the
	// agent's shared one (drift.Subscribe).
	routes, err := drift.Subscribe(l.netnsPath, drift.Kinds{Routes: true},
		func(u netlink.RouteUpdate) bool { return isDefaultRoute(u.Route) }, l.log)
	if err != nil {
		return err
	}
	defer routes.Close()
	var (
		last Spec
		// defaults holds the default routes, listed again only when one
		// changes or a device holding one does: the routes and devices of
		// pods change all the time and never matter here.
		defaults *defaultRoutes
	)
	for {
		txn := l.nodes.db.ReadTxn()
		// Only what the spec reads wakes the job: the health endpoints
		// (not every pod's, which come by the hundred in a burst of ADDs),
		// and the rows and addresses of the devices holding a default
		// route (not the pods' veths).
		_, healthWatch := l.endpoints.ListWatch(txn, endpointmanager.EndpointHealth.Query(true))
		watches := []<-chan struct{}{healthWatch}
		var err error
		if len(l.configured) == 0 && (defaults == nil || defaults.devicesChanged(txn, l.devices)) {
			defaults, err = l.listDefaultRoutes(txn, handle)
		}
		switch {
		case len(l.configured) != 0:
		case err != nil:
			// Listed again at the next change of any device or address.
			_, devWatch := l.devices.AllWatch(txn)
			_, addrWatch := l.addrs.AllWatch(txn)
			watches = append(watches, devWatch, addrWatch)
			defaults = nil
		default:
			watches = append(watches, defaults.watches(txn, l.devices, l.addrs)...)
		}
		var spec Spec
		if err == nil {
			spec, err = l.spec(txn, defaults)
		}
		switch {
		case err != nil:
			// Known all the same, without address (its row says so): a
			// single node needs none, and readiness must not wait for one.
			health.Degraded("Cannot tell this node's address", err)
			l.nodes.claims.set(l.nodes.name, SourceLocal, spec, true)
		case !spec.equal(last):
			l.log.Info("This node", "node", l.nodes.name, "addresses", spec.Addresses, "pod-cidrs", spec.PodCIDRs)
			health.OK(fmt.Sprintf("Node %s at %v", l.nodes.name, ipsOf(spec.Addresses)))
			l.nodes.claims.set(l.nodes.name, SourceLocal, spec, true)
		}
		last = spec
		cases := make([]reflect.SelectCase, 0, 2+len(watches))
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
			reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(routes.Ready())})
		for _, w := range watches {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w)})
		}
		for {
			chosen, _, _ := reflect.Select(cases)
			if chosen == 0 {
				return nil
			}
			if chosen == 1 {
				b, err := routes.Take(math.MaxInt)
				if err != nil {
					return err
				}
				if len(b.Routes) == 0 && !b.Resync {
					continue
				}
				// A default route changed, or updates were lost.
				defaults = nil
			}
			break
		}
	}
}

// handle is a netlink handle in --devices-netns (and that namespace), or
// in the agent's own.
func (l *localNode) handle() (*netlink.Handle, *netns.NsHandle, error) {
	if l.netnsPath == "" {
		h, err := netlink.NewHandle()
		return h, nil, err
	}
	ns, err := netns.GetFromPath(l.netnsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("--devices-netns %s: %w", l.netnsPath, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, nil, err
	}
	return h, &ns, nil
}

// spec is the local node's description now, its addresses from the
// default routes defaults unless --node-ip gives them.
func (l *localNode) spec(txn statedb.ReadTxn, defaults *defaultRoutes) (Spec, error) {
	l.metrics.specs.Inc()
	var s Spec
	for _, p := range l.ipam.Pools() {
		s.PodCIDRs = append(s.PodCIDRs, p.CIDR)
	}
	for ep := range l.endpoints.List(txn, endpointmanager.EndpointHealth.Query(true)) {
		s.HealthIPs = append(s.HealthIPs, ep.IPs()...)
	}
	ips := l.configured
	if len(ips) == 0 {
		var err error
		if ips, err = l.defaultRouteIPs(txn, defaults); err != nil {
			return s, err
		}
	}
	for _, ip := range ips {
		s.Addresses = append(s.Addresses, Address{Type: InternalIP, IP: ip})
	}
	return s, nil
}

// defaultRoutes are the devices holding a default route of the main
// table, in the kernel's order, per family, with the revision of each
// device's row when they were listed (0 if it had none).
type defaultRoutes struct {
	v4, v6    []int
	revisions map[int]statedb.Revision
}

// isDefaultRoute reports whether r is a default route of the main table.
func isDefaultRoute(r netlink.Route) bool {
	if r.Table != 0 && r.Table != unix.RT_TABLE_MAIN {
		return false
	}
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// listDefaultRoutes lists the default routes of the main table.
func (l *localNode) listDefaultRoutes(txn statedb.ReadTxn, handle *netlink.Handle) (*defaultRoutes, error) {
	l.metrics.listings.Inc()
	out := &defaultRoutes{revisions: map[int]statedb.Revision{}}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := handle.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if !isDefaultRoute(r) {
				continue
			}
			if family == netlink.FAMILY_V4 {
				out.v4 = append(out.v4, r.LinkIndex)
			} else {
				out.v6 = append(out.v6, r.LinkIndex)
			}
			_, rev, _ := l.devices.Get(txn, devices.DeviceIfIndex.Query(r.LinkIndex))
			out.revisions[r.LinkIndex] = rev
		}
	}
	return out, nil
}

// watches close when the row of a device holding a default route changes,
// or its node addresses do: what the local node's addresses come from.
func (d *defaultRoutes) watches(txn statedb.ReadTxn, devs statedb.Table[*devices.Device], addrs statedb.Table[*devices.NodeAddress]) []<-chan struct{} {
	var out []<-chan struct{}
	for ifindex := range d.revisions {
		dev, _, watch, found := devs.GetWatch(txn, devices.DeviceIfIndex.Query(ifindex))
		out = append(out, watch)
		if found {
			_, watch := addrs.ListWatch(txn, devices.NodeAddressDevice.Query(dev.Name))
			out = append(out, watch)
		}
	}
	return out
}

// devicesChanged reports whether a device holding a default route changed
// since the listing: the kernel drops the routes of a device that goes
// down, loses the address or goes away without a word.
func (d *defaultRoutes) devicesChanged(txn statedb.ReadTxn, tbl statedb.Table[*devices.Device]) bool {
	for ifindex, rev := range d.revisions {
		if _, now, _ := tbl.Get(txn, devices.DeviceIfIndex.Query(ifindex)); now != rev {
			return true
		}
	}
	return false
}

// defaultRouteIPs are the primary node addresses, one per family, of the
// devices that hold a default route.
func (l *localNode) defaultRouteIPs(txn statedb.ReadTxn, defaults *defaultRoutes) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, family := range []struct {
		ifindexes []int
		v4        bool
	}{{defaults.v4, true}, {defaults.v6, false}} {
		for _, ifindex := range family.ifindexes {
			ip, ok := l.primaryOn(txn, ifindex, family.v4)
			if ok {
				out = append(out, ip)
				break
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no device with a default route has a node address: give --node-ip")
	}
	return out, nil
}

// primaryOn is the primary node address of a family on the device with
// index ifindex.
func (l *localNode) primaryOn(txn statedb.ReadTxn, ifindex int, v4 bool) (netip.Addr, bool) {
	d, _, found := l.devices.Get(txn, devices.DeviceIfIndex.Query(ifindex))
	if !found {
		return netip.Addr{}, false
	}
	for a := range l.addrs.All(txn) {
		if a.Device == d.Name && a.Primary && a.Addr.Is4() == v4 {
			return a.Addr, true
		}
	}
	return netip.Addr{}, false
}

func ipsOf(addrs []Address) []netip.Addr {
	out := make([]netip.Addr, len(addrs))
	for i, a := range addrs {
		out[i] = a.IP
	}
	return slices.Clip(out)
}
