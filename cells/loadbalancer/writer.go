package loadbalancer

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// maxBatch bounds how many Kubernetes events one write transaction applies:
// large enough that a burst costs few commits, small enough that readers
// see progress.
const maxBatch = 1024

// writer owns every write to the services, frontends and backends tables.
// Kubernetes events, node address changes and backend quarantine all go
// through it, one write transaction at a time.
type writer struct {
	log      *slog.Logger
	db       *statedb.DB
	tables   *lbTables
	nodeName string
	health   cell.Health

	mu sync.Mutex
	// slices maps every EndpointSlice with a service label to the name of
	// its service (in the slice's namespace), so that an update that
	// relabels a slice, or a relist that no longer has it, finds its old
	// backends.
	slices map[sliceID]string
	// nodeAddrs are the node addresses NodePort frontends use, sorted.
	nodeAddrs []netip.Addr
	// problems are the invalid objects and frontend conflicts, by object:
	// while there are any, the cell's health is degraded.
	problems map[string]string
	reported bool
	// contested are services that wanted a frontend address another
	// service holds; they get another chance whenever a frontend goes.
	contested map[ServiceName]struct{}
	// servicesListed and slicesListed say whether the initial listings
	// are in. Until both are, frontends wait in deferred: computed from
	// services alone they would reject connections, and the datapath would
	// be programmed twice.
	servicesListed, slicesListed bool
	deferred                     map[ServiceName]struct{}

	// spare is the last batch, whose maps the next one reuses.
	spare batch
}

// k8sEvent is a change from one of the reflectors, already converted.
type k8sEvent interface {
	apply(w *writer, b *batch)
}

// batch is one write transaction and the services whose frontends it must
// recompute before committing.
//
// Queries by service go to the snapshot from before the transaction, plus
// what the transaction itself added, then each hit is read again from the
// transaction by its primary key. Iterating the write transaction instead
// would freeze its trees, and every later insert would copy the path to its
// leaf: several times the cost of the insert itself.
type batch struct {
	txn      statedb.WriteTxn
	snapshot statedb.ReadTxn
	dirty    map[ServiceName]struct{}
	// frontendsDeleted says whether an address was freed, which may
	// settle a contested one.
	frontendsDeleted bool
	// addedFrontends and addedBackends are the addresses of rows this
	// transaction inserted, by service.
	addedFrontends map[ServiceName][]L3n4Addr
	addedBackends  map[ServiceName][]L3n4Addr
}

func (w *writer) newBatch(txn statedb.WriteTxn) *batch {
	b := &w.spare
	if b.dirty == nil {
		b.dirty = map[ServiceName]struct{}{}
		b.addedFrontends = map[ServiceName][]L3n4Addr{}
		b.addedBackends = map[ServiceName][]L3n4Addr{}
	}
	b.txn, b.snapshot, b.frontendsDeleted = txn, w.db.ReadTxn(), false
	return b
}

// release lets go of the transaction and the snapshot, which would keep
// old versions of the tables alive, and of maps that a listing grew large:
// clearing a map keeps its memory.
func (b *batch) release() {
	b.txn, b.snapshot = nil, nil
	if len(b.dirty) > maxBatch || len(b.addedFrontends) > maxBatch || len(b.addedBackends) > maxBatch {
		b.dirty, b.addedFrontends, b.addedBackends = nil, nil, nil
		return
	}
	clear(b.dirty)
	clear(b.addedFrontends)
	clear(b.addedBackends)
}

func (b *batch) markDirty(name ServiceName) { b.dirty[name] = struct{}{} }

func (b *batch) insertFrontend(t *lbTables, fe *Frontend) {
	t.frontends.Insert(b.txn, fe)
	b.addedFrontends[fe.ServiceName] = append(b.addedFrontends[fe.ServiceName], fe.Address)
}

func (b *batch) insertBackend(t *lbTables, be *Backend) {
	t.backends.Insert(b.txn, be)
	for i, inst := range be.Instances {
		// Instances are sorted: a service's come together.
		if i == 0 || inst.ServiceName != be.Instances[i-1].ServiceName {
			b.addedBackends[inst.ServiceName] = append(b.addedBackends[inst.ServiceName], be.Address)
		}
	}
}

// frontendsOf are the service's frontends as of the transaction.
func (b *batch) frontendsOf(t *lbTables, name ServiceName) []*Frontend {
	addrs := slices.Clip(b.addedFrontends[name])
	// A service's frontends go in the transaction that deletes it: without
	// the service, the snapshot has none of its frontends either.
	if _, _, found := t.services.Get(b.snapshot, ServiceByName.Query(name)); found {
		for fe := range t.frontends.List(b.snapshot, FrontendByServiceName.Query(name)) {
			addrs = append(addrs, fe.Address)
		}
	}
	var out []*Frontend
	for i, addr := range addrs {
		if slices.Contains(addrs[:i], addr) {
			continue
		}
		if fe, _, found := t.frontends.Get(b.txn, FrontendByAddress.Query(addr)); found && fe.ServiceName == name {
			out = append(out, fe)
		}
	}
	return out
}

// backendsOf are the backends serving the service as of the transaction.
func (b *batch) backendsOf(t *lbTables, name ServiceName) []*Backend {
	addrs := slices.Clip(b.addedBackends[name])
	for be := range t.backends.List(b.snapshot, BackendByServiceName.Query(name)) {
		addrs = append(addrs, be.Address)
	}
	var out []*Backend
	for i, addr := range addrs {
		if slices.Contains(addrs[:i], addr) {
			continue
		}
		be, _, found := t.backends.Get(b.txn, BackendByAddress.Query(addr))
		if found && slices.ContainsFunc(be.Instances, func(i BackendInstance) bool { return i.ServiceName == name }) {
			out = append(out, be)
		}
	}
	return out
}

// update runs fn in a write transaction and then brings the frontends of
// every service fn marked dirty up to date.
func (w *writer) update(fn func(b *batch)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	txn := w.db.WriteTxn(w.tables.services, w.tables.frontends, w.tables.backends)
	defer txn.Abort()
	b := w.newBatch(txn)
	fn(b)
	if !w.servicesListed || !w.slicesListed {
		maps.Copy(w.deferred, b.dirty)
		clear(b.dirty)
	} else if len(w.deferred) > 0 {
		maps.Copy(b.dirty, w.deferred)
		clear(w.deferred)
	}
	for name := range b.dirty {
		w.updateFrontends(b, name)
	}
	if b.frontendsDeleted && len(w.contested) > 0 {
		for _, name := range slices.Collect(maps.Keys(w.contested)) {
			w.updateFrontends(b, name)
		}
	}
	txn.Commit()
	b.release()
	w.reportHealth()
}

// processEvents applies the reflectors' events in batches until ctx ends.
func (w *writer) processEvents(ctx context.Context, events <-chan k8sEvent) {
	pending := make([]k8sEvent, 0, maxBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			pending = append(pending[:0], ev)
		}
	drain:
		for len(pending) < maxBatch {
			select {
			case ev := <-events:
				pending = append(pending, ev)
			default:
				break drain
			}
		}
		w.update(func(b *batch) {
			for _, ev := range pending {
				ev.apply(w, b)
			}
		})
		// Let the converted objects go while waiting for more.
		clear(pending)
	}
}

// Services.

type serviceUpserted struct {
	svc     *Service
	invalid []invalidField
}

func (e *serviceUpserted) apply(w *writer, b *batch) { w.upsertService(b, e.svc, e.invalid) }

type serviceDeleted struct{ name ServiceName }

func (e *serviceDeleted) apply(w *writer, b *batch) { w.deleteService(b, e.name) }

// servicesListed is a complete listing: services not in it are gone.
type servicesListed struct{ services []serviceUpserted }

func (e *servicesListed) apply(w *writer, b *batch) {
	listed := make(map[ServiceName]struct{}, len(e.services))
	for _, u := range e.services {
		listed[u.svc.Name] = struct{}{}
		w.upsertService(b, u.svc, u.invalid)
	}
	var gone []ServiceName
	for svc := range w.tables.services.All(b.txn) {
		if _, ok := listed[svc.Name]; !ok {
			gone = append(gone, svc.Name)
		}
	}
	for _, name := range gone {
		w.deleteService(b, name)
	}
	w.servicesListed = true
	w.tables.servicesSynced(b.txn)
}

func serviceProblemKey(name ServiceName) func() string {
	return func() string { return "Service " + name.String() }
}

func (w *writer) upsertService(b *batch, svc *Service, invalid []invalidField) {
	w.setProblem(serviceProblemKey(svc.Name), invalid)
	old, _, found := w.tables.services.Get(b.txn, ServiceByName.Query(svc.Name))
	if found && old.equal(svc) {
		return
	}
	w.tables.services.Insert(b.txn, svc)
	b.markDirty(svc.Name)
}

func (w *writer) deleteService(b *batch, name ServiceName) {
	w.setProblem(serviceProblemKey(name), nil)
	if _, found, _ := w.tables.services.Delete(b.txn, &Service{Name: name}); found {
		b.markDirty(name)
	}
}

// EndpointSlices.

type sliceUpserted struct {
	slice   *endpointSlice
	invalid []invalidField
}

func (e *sliceUpserted) apply(w *writer, b *batch) { w.upsertSlice(b, e.slice, e.invalid) }

type sliceDeleted struct{ id sliceID }

func (e *sliceDeleted) apply(w *writer, b *batch) { w.deleteSlice(b, e.id) }

// slicesListed is a complete listing: slices not in it are gone.
type slicesListed struct{ slices []sliceUpserted }

func (e *slicesListed) apply(w *writer, b *batch) {
	listed := make(map[sliceID]struct{}, len(e.slices))
	for _, u := range e.slices {
		listed[u.slice.id] = struct{}{}
		w.upsertSlice(b, u.slice, u.invalid)
	}
	for id := range w.slices {
		if _, ok := listed[id]; !ok {
			w.deleteSlice(b, id)
		}
	}
	// A slice without a service label is in no map but may have had a
	// problem.
	for key := range w.problems {
		if id, ok := strings.CutPrefix(key, "EndpointSlice "); ok {
			ns, name, _ := strings.Cut(id, "/")
			if _, ok := listed[sliceID{ns, name}]; !ok {
				w.setProblemMessage(key, "")
			}
		}
	}
	w.slicesListed = true
	w.tables.slicesSynced(b.txn)
}

func sliceProblemKey(id sliceID) func() string {
	return func() string { return "EndpointSlice " + id.String() }
}

func (w *writer) upsertSlice(b *batch, s *endpointSlice, invalid []invalidField) {
	w.setProblem(sliceProblemKey(s.id), invalid)
	oldName, known := w.slices[s.id]
	if known && oldName != s.service.Name {
		w.removeSliceBackends(b, s.id, ServiceName{Namespace: s.id.Namespace, Name: oldName})
		known = false
	}
	if s.service.Name == "" {
		delete(w.slices, s.id)
		return
	}
	if !known {
		w.slices[s.id] = s.service.Name
	}
	if w.log.Enabled(context.Background(), slog.LevelDebug) {
		if _, _, found := w.tables.services.Get(b.txn, ServiceByName.Query(s.service)); !found {
			w.log.Debug("EndpointSlice for a Service not seen yet: keeping its backends until the Service appears",
				"endpointslice", s.id, "service", s.service)
		}
	}

	changed := false
	// Backends the slice listed before and no longer does lose their
	// instances. A slice seen for the first time has none.
	if known {
		for _, addr := range w.sliceBackends(b, s.service, s.id.Name) {
			if !slices.ContainsFunc(s.backends, func(sb sliceBackend) bool { return sb.addr == addr }) {
				changed = w.setSliceInstances(b, addr, s.service, s.id.Name, nil) || changed
			}
		}
	}
	// s.backends is sorted by address: each run is one backend.
	for start := 0; start < len(s.backends); {
		end := start + 1
		for end < len(s.backends) && s.backends[end].addr == s.backends[start].addr {
			end++
		}
		instances := make([]BackendInstance, end-start)
		for i, sb := range s.backends[start:end] {
			instances[i] = BackendInstance{
				ServiceName:   s.service,
				PortName:      sb.portName,
				State:         sb.state,
				NodeName:      sb.nodeName,
				EndpointSlice: s.id.Name,
			}
		}
		changed = w.setSliceInstances(b, s.backends[start].addr, s.service, s.id.Name, instances) || changed
		start = end
	}
	if changed {
		b.markDirty(s.service)
	}
}

func (w *writer) deleteSlice(b *batch, id sliceID) {
	w.setProblem(sliceProblemKey(id), nil)
	if name, ok := w.slices[id]; ok {
		w.removeSliceBackends(b, id, ServiceName{Namespace: id.Namespace, Name: name})
		delete(w.slices, id)
	}
}

func (w *writer) removeSliceBackends(b *batch, id sliceID, svc ServiceName) {
	changed := false
	for _, addr := range w.sliceBackends(b, svc, id.Name) {
		changed = w.setSliceInstances(b, addr, svc, id.Name, nil) || changed
	}
	if changed {
		b.markDirty(svc)
	}
}

// sliceBackends are the addresses of svc's backends that came from slice.
func (w *writer) sliceBackends(b *batch, svc ServiceName, slice string) []L3n4Addr {
	var addrs []L3n4Addr
	for _, be := range b.backendsOf(w.tables, svc) {
		for _, inst := range be.Instances {
			if inst.ServiceName == svc && inst.EndpointSlice == slice {
				addrs = append(addrs, be.Address)
				break
			}
		}
	}
	return addrs
}

// setSliceInstances replaces the instances the slice gave the backend at
// addr, deleting the backend when it has none left. It reports whether the
// backend changed.
func (w *writer) setSliceInstances(b *batch, addr L3n4Addr, svc ServiceName, slice string, instances []BackendInstance) bool {
	old, _, found := w.tables.backends.Get(b.txn, BackendByAddress.Query(addr))
	merged := instances
	if found {
		merged = make([]BackendInstance, 0, len(old.Instances)+len(instances))
		for _, inst := range old.Instances {
			if inst.ServiceName != svc || inst.EndpointSlice != slice {
				merged = append(merged, inst)
			}
		}
		merged = append(merged, instances...)
	}
	// A slice that lists an address twice for a port counts once,
	// preferring the active listing.
	slices.SortFunc(merged, func(a, b BackendInstance) int {
		if c := a.compare(b); c != 0 {
			return c
		}
		return stateRank(a.State) - stateRank(b.State)
	})
	merged = slices.CompactFunc(merged, func(a, b BackendInstance) bool {
		return a.compare(b) == 0
	})
	if len(merged) == 0 {
		if found {
			w.tables.backends.Delete(b.txn, old)
		}
		return found
	}
	be := &Backend{Address: addr, Instances: slices.Clip(merged)}
	if found {
		be.Quarantined = old.Quarantined
		if old.equal(be) {
			return false
		}
	}
	b.insertBackend(w.tables, be)
	return true
}

func stateRank(s BackendState) int {
	if s == BackendActive {
		return 0
	}
	return 1
}

// Node addresses.

// setNodeAddresses recomputes the NodePort frontends for a new set of node
// addresses. initialized says the node-addresses table has its initial
// contents.
func (w *writer) setNodeAddresses(addrs []netip.Addr, initialized bool) {
	w.update(func(b *batch) {
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

// Quarantine.

func (w *writer) setQuarantined(addr L3n4Addr, quarantined bool) (err error) {
	w.update(func(b *batch) {
		old, _, found := w.tables.backends.Get(b.txn, BackendByAddress.Query(addr))
		if !found {
			err = fmt.Errorf("no backend %s", addr)
			return
		}
		if old.Quarantined == quarantined {
			return
		}
		be := *old
		be.Quarantined = quarantined
		b.insertBackend(w.tables, &be)
		for _, inst := range be.Instances {
			b.markDirty(inst.ServiceName)
		}
	})
	return err
}

// Frontends.

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
		default:
			fe.Status = reconciler.StatusPending()
			b.insertFrontend(w.tables, fe)
		}
	}
	for _, old := range existing {
		if !slices.ContainsFunc(desired, func(fe *Frontend) bool { return fe.Address == old.Address }) {
			w.tables.frontends.Delete(b.txn, old)
			b.frontendsDeleted = true
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
				Address:         L3n4Addr{Addr: addr, Port: p, Protocol: port.Protocol},
				Type:            typ,
				ServiceName:     svc.Name,
				PortName:        port.Name,
				Backends:        sel.pick(addr.Is6(), local),
				SessionAffinity: svc.SessionAffinity,
				AffinityTimeout: svc.AffinityTimeout,
			})
		}
		for _, a := range svc.ClusterIPs {
			add(FrontendClusterIP, a, port.Port)
		}
		for _, a := range svc.ExternalIPs {
			add(FrontendExternalIP, a, port.Port)
		}
		for _, a := range svc.LoadBalancerIPs {
			add(FrontendLoadBalancer, a, port.Port)
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

// backendSelector picks the backends of one service port for a frontend.
// Frontends of the same family and locality share one slice.
type backendSelector struct {
	svc      *Service
	port     ServicePort
	backends []*Backend
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
// no backend is active, sorted by address.
func (s *backendSelector) selectBackends(is6, local bool) []L3n4Addr {
	var active, terminating []L3n4Addr
	for _, be := range s.backends {
		if be.Quarantined || be.Address.Addr.Is6() != is6 || be.Address.Protocol != s.port.Protocol {
			continue
		}
		best := BackendState("")
		for _, inst := range be.Instances {
			if inst.ServiceName != s.svc.Name || inst.PortName != s.port.Name {
				continue
			}
			if local && inst.NodeName != s.nodeName {
				continue
			}
			if inst.State == BackendActive || best == "" {
				best = inst.State
			}
		}
		switch best {
		case BackendActive:
			active = append(active, be.Address)
		case BackendTerminating:
			terminating = append(terminating, be.Address)
		}
	}
	picked := active
	if len(picked) == 0 {
		picked = terminating
	}
	slices.SortFunc(picked, L3n4Addr.Compare)
	return slices.Clip(picked)
}

// Health.

// setProblem records (or with no invalid fields, clears) the invalid
// fields of an object, logging each change once. object builds the
// object's key, only when there is something to record or clear: the
// common case, a valid object and no problems, costs nothing.
func (w *writer) setProblem(object func() string, invalid []invalidField) {
	if len(invalid) == 0 && len(w.problems) == 0 {
		return
	}
	var msg string
	if len(invalid) > 0 {
		parts := make([]string, len(invalid))
		for i, f := range invalid {
			parts[i] = f.Error()
		}
		msg = strings.Join(parts, "; ")
	}
	w.setProblemMessage(object(), msg)
}

func (w *writer) setProblemMessage(object, msg string) {
	old, had := w.problems[object]
	switch {
	case msg == "" && had:
		delete(w.problems, object)
		w.log.Info("Problem resolved", "object", object)
	case msg != "" && old != msg:
		w.problems[object] = msg
		w.log.Warn("Skipping invalid or conflicting parts of a Kubernetes object", "object", object, "problem", msg)
	}
	if msg != old {
		w.reported = false
	}
}

// maxProblemsShown keeps the health message short; the log has them all.
const maxProblemsShown = 3

func (w *writer) reportHealth() {
	if w.reported {
		return
	}
	w.reported = true
	if len(w.problems) == 0 {
		w.health.OK("No problem with Services or EndpointSlices")
		return
	}
	keys := slices.Sorted(maps.Keys(w.problems))
	shown := keys[:min(len(keys), maxProblemsShown)]
	parts := make([]string, len(shown))
	for i, k := range shown {
		parts[i] = k + ": " + w.problems[k]
	}
	msg := strings.Join(parts, "; ")
	if len(keys) > len(shown) {
		msg += fmt.Sprintf("; and %d more", len(keys)-len(shown))
	}
	w.health.Degraded(fmt.Sprintf("%d Kubernetes objects skipped in part", len(keys)), fmt.Errorf("%s", msg))
}
