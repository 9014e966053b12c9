package loadbalancer

import (
	"context"
	"iter"
	"log/slog"
	"slices"
)

// EndpointSlices into the backends table: each slice adds an instance to
// the backend of every address and port it lists, and takes back the
// instances it no longer lists.

// sliceServices maps every EndpointSlice with a service label to the name
// of its service (in the slice's namespace), by namespace and then slice
// name: a slot of the inner maps is two strings, 32 bytes, where a map by
// sliceID took 48 (an entry per slice, 50,000 of them and more).
type sliceServices map[string]map[string]string

func (m sliceServices) get(id sliceID) (string, bool) {
	svc, ok := m[id.Namespace][id.Name]
	return svc, ok
}

func (m sliceServices) set(id sliceID, svc string) {
	ns := m[id.Namespace]
	if ns == nil {
		ns = map[string]string{}
		m[id.Namespace] = ns
	}
	ns[id.Name] = svc
}

func (m sliceServices) delete(id sliceID) {
	ns := m[id.Namespace]
	delete(ns, id.Name)
	if len(ns) == 0 {
		delete(m, id.Namespace)
	}
}

// all is every slice, in no order. The caller may delete as it goes.
func (m sliceServices) all() iter.Seq[sliceID] {
	return func(yield func(sliceID) bool) {
		for namespace, ns := range m {
			for name := range ns {
				if !yield(sliceID{namespace, name}) {
					return
				}
			}
		}
	}
}

func sliceProblemKey(id sliceID) func() string {
	return func() string { return "EndpointSlice " + id.String() }
}

func (w *writer) upsertSlice(b *batch, s *endpointSlice, invalid []invalidField) {
	w.setProblem(sliceProblemKey(s.id), invalid)
	oldName, known := w.slices.get(s.id)
	if known && oldName != s.service.Name {
		w.removeSliceBackends(b, s.id, ServiceName{Namespace: s.id.Namespace, Name: oldName})
		known = false
	}
	if s.service.Name == "" {
		w.slices.delete(s.id)
		return
	}
	if !known {
		w.slices.set(s.id, s.service.Name)
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
	if name, ok := w.slices.get(id); ok {
		w.removeSliceBackends(b, id, ServiceName{Namespace: id.Namespace, Name: name})
		w.slices.delete(id)
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
