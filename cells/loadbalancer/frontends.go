package loadbalancer

import (
	"context"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Frontend derivation: what a service's frontends are, given the service,
// its backends and the node's addresses, and bringing the frontends table
// to that.

// setNodeAddresses recomputes the NodePort frontends for a new set of node
// addresses. initialized says the node-addresses table has its initial
// contents.
func (w *writer) setNodeAddresses(ctx context.Context, addrs []netip.Addr, initialized bool) {
	w.update(ctx, func(b *batch) {
		if !slices.Equal(addrs, w.nodeAddrs) {
			w.nodeAddrs = addrs
			for svc := range w.tables.services.All(b.txn) {
				if svc.hasNodePorts() {
					b.markDirty(svc.Name)
				}
			}
		}
		if initialized {
			w.tables.nodeAddressesSynced(b.txn)
		}
	})
}

func (s *Service) hasNodePorts() bool {
	if s.Type != ServiceNodePort && s.Type != ServiceLoadBalancer {
		return false
	}
	return slices.ContainsFunc(s.Ports, func(p ServicePort) bool { return p.NodePort != 0 })
}

// updateFrontends brings the frontends of the service up to date: inserts
// those that are new or changed (Pending), leaves unchanged ones alone so
// their status stays, and deletes those it no longer has.
func (w *writer) updateFrontends(b *batch, name ServiceName) {
	var desired []*Frontend
	if svc, _, found := w.tables.services.Get(b.txn, ServiceByName.Query(name)); found {
		desired = w.desiredFrontends(b, svc)
	}
	existing := b.frontendsOf(w.tables, name)

	var conflicts []string
	for _, fe := range desired {
		old, _, found := w.tables.frontends.Get(b.txn, FrontendByAddress.Query(fe.Address))
		switch {
		case found && old.ServiceName != name:
			conflicts = append(conflicts, fmt.Sprintf("frontend %s is %s's", fe.Address, old.ServiceName))
		case found && old.sameContent(fe):
		case !found && w.heldAlready(fe):
			fe.SetStatus(reconciler.StatusDone())
			b.insertFrontend(w.tables, fe)
		default:
			fe.SetStatus(reconciler.StatusPending())
			b.insertFrontend(w.tables, fe)
		}
	}
	for _, old := range existing {
		if !slices.ContainsFunc(desired, func(fe *Frontend) bool { return fe.Address == old.Address }) {
			w.tables.frontends.Delete(b.txn, old)
			b.frontendsDeleted = true
			if !w.frontendsSynced {
				if w.syncDeleted == nil {
					w.syncDeleted = map[L3n4Addr]struct{}{}
				}
				w.syncDeleted[old.Address] = struct{}{}
			}
		}
	}

	key := func() string { return "Service " + name.String() + " frontends" }
	if len(conflicts) > 0 {
		w.contested[name] = struct{}{}
		w.setProblemMessage(key(), strings.Join(conflicts, "; "))
	} else if _, was := w.contested[name]; was {
		delete(w.contested, name)
		w.setProblemMessage(key(), "")
	}
}

// Programmed says whether the datapath's maps hold a frontend exactly as
// given, so that reconciling it would write nothing (lb-maps provides it:
// on a restart its maps hold what the agent wrote before). It never waits:
// false when it cannot tell at once.
type Programmed interface {
	Holds(fe *Frontend) bool
}

// heldAlready says whether fe, which has no row in the frontends table,
// goes in reconciled (Done) rather than Pending, because the maps hold it
// already: on a restart with nothing changed, the reconciler would compare
// each frontend with the maps, write nothing and write each row again for
// its status, 50,000 rows at 50,000 Services.
//
// Only while the frontends table waits for its first complete contents,
// and only at an address that had no row since the agent started (none
// now, none deleted, see syncDeleted): the reconciler changes what the
// maps hold for an address only for a row at it, or when pruning, which
// waits for the table's first complete contents. So what Programmed
// answered stays true until the row is in the table, and the reconciler
// has nothing at that address left to do. A map entry changed behind the
// agent's back while it was down is read as it is at restore, does not
// match, and the frontend goes in Pending to be written again.
func (w *writer) heldAlready(fe *Frontend) bool {
	if w.programmed == nil || w.frontendsSynced {
		return false
	}
	if _, deleted := w.syncDeleted[fe.Address]; deleted {
		return false
	}
	return w.programmed.Holds(fe)
}

// desiredFrontends are the frontends svc should have now.
func (w *writer) desiredFrontends(b *batch, svc *Service) []*Frontend {
	if len(svc.Ports) == 0 {
		return nil
	}
	backends := b.backendsOf(w.tables, svc.Name)
	var out []*Frontend
	for _, port := range svc.Ports {
		sel := backendSelector{svc: svc, port: port, backends: backends, nodeName: w.nodeName}
		add := func(typ FrontendType, addr netip.Addr, p uint16) {
			local := svc.ExtTrafficPolicyLocal
			if typ == FrontendClusterIP {
				local = svc.IntTrafficPolicyLocal
			}
			out = append(out, &Frontend{
				Address:            L3n4Addr{Addr: addr, Port: p, Protocol: port.Protocol},
				Type:               typ,
				ServiceName:        svc.Name,
				PortName:           port.Name,
				Backends:           sel.pick(addr.Is6(), local),
				TrafficPolicyLocal: local,
				SessionAffinity:    svc.SessionAffinity,
				AffinityTimeout:    svc.AffinityTimeout,
			})
		}
		for typ, a := range svc.addrsAt() {
			add(typ, a, port.Port)
		}
		if port.NodePort != 0 && svc.hasNodePorts() {
			// A NodePort serves the service's address families only: an
			// IPv4-only service has no backends to offer on an IPv6 node
			// address.
			for _, wildcard := range []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()} {
				if !slices.ContainsFunc(svc.ClusterIPs, func(a netip.Addr) bool { return a.Is6() == wildcard.Is6() }) {
					continue
				}
				for _, a := range w.nodeAddrs {
					if a.Is6() == wildcard.Is6() {
						add(FrontendNodePort, a, port.NodePort)
					}
				}
				add(FrontendNodePort, wildcard, port.NodePort)
			}
		}
	}
	return out
}

// addrsAt are the addresses at which each of the service's ports has a
// frontend whatever the node's addresses: its ClusterIPs, external IPs and
// load-balancer IPs.
func (s *Service) addrsAt() iter.Seq2[FrontendType, netip.Addr] {
	return func(yield func(FrontendType, netip.Addr) bool) {
		for _, list := range []struct {
			typ   FrontendType
			addrs []netip.Addr
		}{{FrontendClusterIP, s.ClusterIPs}, {FrontendExternalIP, s.ExternalIPs}, {FrontendLoadBalancer, s.LoadBalancerIPs}} {
			for _, a := range list.addrs {
				if !yield(list.typ, a) {
					return
				}
			}
		}
	}
}

// frontendAddrs appends to addrs the addresses of the frontends svc has
// in txn: those at the addresses its row names, and its NodePort ones
// (index nodeport). Some may be another service's, which holds the address
// (a conflict): callers look each up and check its service.
func frontendAddrs(txn statedb.ReadTxn, frontends statedb.Table[*Frontend], svc *Service, addrs []L3n4Addr) []L3n4Addr {
	for _, port := range svc.Ports {
		for _, a := range svc.addrsAt() {
			addrs = append(addrs, L3n4Addr{Addr: a, Port: port.Port, Protocol: port.Protocol})
		}
	}
	for fe := range frontends.List(txn, FrontendNodePortsByService.Query(svc.Name)) {
		addrs = append(addrs, fe.Address)
	}
	return addrs
}

// FrontendsOf are the frontends of svc in txn, sorted by address; svc is
// the service's row in the same txn. The writer keeps a service's
// frontends at the addresses its row names and its NodePort ones in the
// nodeport index, so no index by service is needed.
func FrontendsOf(txn statedb.ReadTxn, frontends statedb.Table[*Frontend], svc *Service) []*Frontend {
	return heldAt(txn, frontends, svc.Name, frontendAddrs(txn, frontends, svc, nil))
}

// heldAt are the frontends at addrs (which it sorts, and may hold an
// address twice) that name holds in txn, sorted by address.
func heldAt(txn statedb.ReadTxn, frontends statedb.Table[*Frontend], name ServiceName, addrs []L3n4Addr) []*Frontend {
	slices.SortFunc(addrs, L3n4Addr.Compare)
	addrs = slices.Compact(addrs)
	out := make([]*Frontend, 0, len(addrs))
	for _, addr := range addrs {
		if fe, _, found := frontends.Get(txn, FrontendByAddress.Query(addr)); found && fe.ServiceName == name {
			out = append(out, fe)
		}
	}
	return out
}

// backendSelector picks the backends of one service port for a frontend.
// Frontends of the same family and locality share one slice.
type backendSelector struct {
	svc      *Service
	port     ServicePort
	backends []*SliceBackends
	nodeName string
	picked   [2][2][]L3n4Addr
	done     [2][2]bool
}

func (s *backendSelector) pick(is6, local bool) []L3n4Addr {
	i, j := boolIndex(is6), boolIndex(local)
	if !s.done[i][j] {
		s.picked[i][j] = s.selectBackends(is6, local)
		s.done[i][j] = true
	}
	return s.picked[i][j]
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// selectBackends returns the active backends, or the terminating ones when
// no backend is active, sorted by address. An address two slices list is
// active if either says so.
func (s *backendSelector) selectBackends(is6, local bool) []L3n4Addr {
	var active, terminating []L3n4Addr
	for _, row := range s.backends {
		for _, be := range row.Backends {
			if be.Quarantined || be.PortName != s.port.Name || be.Address.Protocol != s.port.Protocol ||
				be.Address.Addr.Is6() != is6 || (local && be.NodeName != s.nodeName) {
				continue
			}
			switch be.State {
			case BackendActive:
				active = append(active, be.Address)
			case BackendTerminating:
				terminating = append(terminating, be.Address)
			}
		}
	}
	picked := active
	if len(picked) == 0 {
		picked = terminating
	}
	slices.SortFunc(picked, L3n4Addr.Compare)
	return slices.Clip(slices.Compact(picked))
}
