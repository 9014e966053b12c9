package endpointmanager

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cilium/hive/job"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/metrics"
)

// hostRouteRefresh is how often every ready endpoint's host routes are
// compared with the kernel, for what no route update tells: a host side
// set down and up again loses its IPv4 routes without one.
const hostRouteRefresh = 30 * time.Minute

// newRepairs counts what the endpoint manager puts back in the kernel.
func newRepairs(log *slog.Logger) *drift.Repairs { return drift.NewRepairs(log, "endpoint-manager") }

func repairMetrics(r *drift.Repairs) metrics.Collectors { return r.Collectors() }

// registerHostRouteRepair follows the route updates of the agent's
// namespace: a host route to a ready endpoint that is deleted, or written
// over, is put back.
func registerHostRouteRepair(m *Manager, repairs *drift.Repairs, jobs job.Group) {
	m.repairs = repairs
	f := &drift.Follower{Routes: true, Handle: m.hostRoutesChanged, Log: m.log}
	jobs.Add(job.OneShot("host-route-changes", f.Run, drift.Retry))
	jobs.Add(job.Timer("host-route-refresh", func(ctx context.Context) error {
		m.repairHostRoutes(ctx, m.Endpoints())
		return nil
	}, hostRouteRefresh))
}

// hostRoutesChanged repairs the endpoints whose host route a batch of
// route updates removed or replaced; after lost updates, every endpoint.
func (m *Manager) hostRoutesChanged(ctx context.Context, b drift.Batch) {
	if b.Resync {
		m.repairHostRoutes(ctx, m.Endpoints())
		return
	}
	txn := m.db.ReadTxn()
	var eps []*Endpoint
	seen := map[uint16]bool{}
	for _, u := range b.Routes {
		if u.Dst == nil || u.Table != unix.RT_TABLE_MAIN {
			continue
		}
		ones, bits := u.Dst.Mask.Size()
		ip, ok := netip.AddrFromSlice(u.Dst.IP)
		if ones != bits || !ok {
			continue
		}
		ep, _, found := m.tbl.Get(txn, EndpointIP.Query(ip.Unmap()))
		if !found || !ep.routed() || seen[ep.ID] {
			continue
		}
		// The endpoint's own route deleted, or another written at its
		// address (a replace removes the route it replaces, with no
		// update of its own).
		if (u.Type == unix.RTM_DELROUTE) == (u.LinkIndex == ep.HostIfIndex) {
			seen[ep.ID] = true
			eps = append(eps, ep)
		}
	}
	if len(eps) > 0 {
		m.repairHostRoutes(ctx, eps)
	}
}

// repairHostRoutes puts back the host routes that the ready endpoints eps
// lack, each with its container's lock held, and counts each as a repair.
// An endpoint whose routes are all there costs nothing but one dump of
// the host's routes for all of them: nothing is written.
func (m *Manager) repairHostRoutes(ctx context.Context, eps []*Endpoint) {
	host, err := readHost()
	if err != nil {
		m.log.Warn("Cannot compare the endpoints' host routes with the kernel", "error", err)
		return
	}
	for _, ep := range eps {
		if !ep.routed() {
			continue
		}
		intact := true
		for _, ip := range ep.IPs() {
			intact = intact && host.hasRoute(ip, ep.HostIfIndex)
		}
		if intact {
			continue
		}
		if err := m.repairHostRoute(ctx, ep.ContainerID); err != nil {
			m.log.Warn("Cannot put back an endpoint's host route", "id", ep.ID, "container", ep.ContainerID, "error", err)
		}
	}
}

// repairHostRoute writes the host routes the endpoint of containerID
// lacks, if it is still the ready endpoint it was, on the same host side.
func (m *Manager) repairHostRoute(ctx context.Context, containerID string) error {
	unlock, err := m.locks.lockContainer(ctx, containerID)
	if err != nil {
		return err
	}
	defer unlock()
	ep, found := m.Lookup(Selector{ContainerID: containerID})
	if !found || !ep.routed() {
		return nil
	}
	link, err := netlink.LinkByIndex(ep.HostIfIndex)
	if err != nil || link.Attrs().Name != ep.HostIfName {
		// The host side itself is gone: not a route to put back.
		return nil
	}
	for _, ip := range ep.IPs() {
		r := hostRoute(ep.HostIfIndex, ip)
		have, err := netlink.RouteListFiltered(family(ip), &netlink.Route{Dst: r.Dst, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("list routes to %s: %w", ip, err)
		}
		if hasRoute(have, r) {
			continue
		}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s dev %s: %w", r.Dst, ep.HostIfName, err)
		}
		m.repairs.Repaired("host-route", fmt.Sprintf("%s dev %s (endpoint %d)", r.Dst, ep.HostIfName, ep.ID))
	}
	return nil
}
