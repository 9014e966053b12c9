package monitor

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/addrmap"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/version"
)

// notifier makes the agent notifications: it watches the agent's state
// rather than being told, so that no other cell has to call the monitor.
type notifier struct {
	publish   func(monitorapi.Event)
	db        *statedb.DB
	endpoints statedb.Table[*endpointmanager.Endpoint]
	services  statedb.Table[*loadbalancer.Service]
	frontends statedb.Table[*loadbalancer.Frontend]
	readiness *health.Readiness
}

func (n *notifier) notify(typ, format string, args ...any) {
	n.publish(&monitorapi.AgentEvent{Type: typ, Message: fmt.Sprintf(format, args...), Time: time.Now()})
}

// agentStarted waits for the "cells-started" readiness barrier, which the
// last start hook of the agent completes.
func (n *notifier) agentStarted(ctx context.Context, _ cell.Health) error {
	for {
		hz, watch := n.readiness.Status()
		if hz.Started {
			n.notify(monitorapi.AgentStarted, "agent %s started", version.Get().Version)
			return nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
}

// maxKeptChanges is the most changes whose room changes keeps between
// batches.
const maxKeptChanges = 1024

// changes follows tbl from the moment it is initialized: the first call of
// batch gets every object then in the table (the baseline, which is not
// news), later calls what changed since the previous one. Once it has the
// baseline it reports health OK: from then on every change is news. It
// returns when ctx ends.
func changes[Obj any](ctx context.Context, db *statedb.DB, tbl statedb.Table[Obj], health cell.Health, batch func(first bool, changes []statedb.Change[Obj])) error {
	wtxn := db.WriteTxn(tbl)
	iter, err := tbl.Changes(wtxn)
	wtxn.Commit()
	if err != nil {
		return fmt.Errorf("watch table %s: %w", tbl.Name(), err)
	}
	defer iter.Close()

	// Rows written before the table is initialized are restored or synced
	// state, not changes: waiting keeps them out of the notifications.
	if tables.WaitInitialized(ctx, db, tbl) != nil {
		return nil // stopping
	}
	var buf []statedb.Change[Obj]
	for first := true; ; first = false {
		seq, watch := iter.Next(db.ReadTxn())
		buf = buf[:0]
		for change := range seq {
			buf = append(buf, change)
		}
		batch(first, buf)
		if cap(buf) > maxKeptChanges {
			// The first batch holds every row of a large table; later
			// ones are small. Not kept, its room would stay allocated.
			buf = nil
		}
		if first {
			health.OK(fmt.Sprintf("Notifying changes of table %s", tbl.Name()))
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return nil
		}
	}
}

// watchEndpoints reports endpoints created and deleted. An endpoint ID
// reused by another container between two looks is both.
func (n *notifier) watchEndpoints(ctx context.Context, health cell.Health) error {
	known := map[uint16]*endpointmanager.Endpoint{}
	return changes(ctx, n.db, n.endpoints, health, func(first bool, changes []statedb.Change[*endpointmanager.Endpoint]) {
		for _, c := range changes {
			ep := c.Object
			old, had := known[ep.ID]
			if had && (c.Deleted || old.ContainerID != ep.ContainerID) {
				delete(known, ep.ID)
				n.notify(monitorapi.EndpointDeleted, "%s", describeEndpoint(old))
			}
			if c.Deleted {
				continue
			}
			if _, had := known[ep.ID]; !had && !first {
				n.notify(monitorapi.EndpointCreated, "%s", describeEndpoint(ep))
			}
			known[ep.ID] = ep
		}
	})
}

func describeEndpoint(ep *endpointmanager.Endpoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "endpoint %d", ep.ID)
	if ep.PodName != "" {
		fmt.Fprintf(&b, " pod %s/%s", ep.PodNamespace, ep.PodName)
	}
	for _, ip := range ep.IPs() {
		fmt.Fprintf(&b, " %s", ip)
	}
	fmt.Fprintf(&b, " on %s (ifindex %d)", ep.HostIfName, ep.HostIfIndex)
	return b.String()
}

// watchFrontends reports services whose frontends changed, one
// notification per service and batch of changes: a Service has a frontend
// per address and port, and one change to it touches several. Status
// changes (the lb-maps reconciler at work) are not news. It keeps the
// latest row of each frontend to tell the two apart, and nothing else: a
// notification describes the service from the table as it is, so that the
// notifier's memory stays a pointer per frontend, by a compact key (with
// 50,000 services, a copy of each service's frontends was 40 MB; a map by
// loadbalancer.L3n4Addr 4.7 MB).
func (n *notifier) watchFrontends(ctx context.Context, health cell.Health) error {
	byAddr := addrmap.New[*loadbalancer.Frontend]()
	return changes(ctx, n.db, n.frontends, health, func(first bool, changes []statedb.Change[*loadbalancer.Frontend]) {
		// The first batch is the table as it is (at 50,000 Services, as
		// many rows): remembered, not notified, so nothing is touched.
		touched := map[loadbalancer.ServiceName]bool{}
		touch := func(name loadbalancer.ServiceName) {
			if !first {
				touched[name] = true
			}
		}
		for _, c := range changes {
			fe := c.Object
			key := addrmap.KeyOf(fe.Address.Addr, fe.Address.Port, uint8(fe.Address.Protocol))
			old, had := byAddr.Get(key)
			switch {
			case c.Deleted:
				byAddr.Delete(key)
				if had {
					touch(old.ServiceName)
				}
				continue
			case !had:
				touch(fe.ServiceName)
			case !sameFrontend(old, fe):
				// A frontend may move to another service.
				touch(old.ServiceName)
				touch(fe.ServiceName)
			}
			byAddr.Set(key, fe)
		}
		if first {
			return
		}
		txn := n.db.ReadTxn()
		for _, name := range slices.SortedFunc(maps.Keys(touched), compareServiceNames) {
			var fes []*loadbalancer.Frontend
			if svc, _, found := n.services.Get(txn, loadbalancer.ServiceByName.Query(name)); found {
				fes = loadbalancer.FrontendsOf(txn, n.frontends, svc)
			}
			if len(fes) == 0 {
				n.notify(monitorapi.ServiceDeleted, "service %s", name)
				continue
			}
			n.notify(monitorapi.ServiceUpdated, "%s", describeService(name, fes))
		}
	})
}

func compareServiceNames(a, b loadbalancer.ServiceName) int {
	return strings.Compare(a.String(), b.String())
}

// sameFrontend is whether a and b differ in nothing but their status.
func sameFrontend(a, b *loadbalancer.Frontend) bool {
	x, y := *a, *b
	x.Status, y.Status = tables.PackedStatus{}, tables.PackedStatus{}
	return reflect.DeepEqual(x, y)
}

// maxListed keeps a notification short for a service with many frontends
// or backends.
const maxListed = 4

func describeService(name loadbalancer.ServiceName, fes []*loadbalancer.Frontend) string {
	var frontends []string
	backends := map[loadbalancer.L3n4Addr]bool{}
	for _, fe := range fes {
		frontends = append(frontends, fmt.Sprintf("%s %s", fe.Address, fe.Type))
		for _, be := range fe.Backends {
			backends[be] = true
		}
	}
	slices.Sort(frontends)
	var bes []string
	for be := range backends {
		bes = append(bes, be.String())
	}
	slices.Sort(bes)
	return fmt.Sprintf("service %s: %s, %s", name, list("frontend", frontends), list("backend", bes))
}

// list reads "2 backends (a, b)", eliding beyond maxListed.
func list(noun string, items []string) string {
	if len(items) == 0 {
		return "no " + noun + "s"
	}
	shown := items
	if len(items) > maxListed {
		shown = append(items[:maxListed:maxListed], "...")
	}
	plural := "s"
	if len(items) == 1 {
		plural = ""
	}
	return fmt.Sprintf("%d %s%s (%s)", len(items), noun, plural, strings.Join(shown, ", "))
}
