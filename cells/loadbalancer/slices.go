package loadbalancer

import (
	"context"
	"iter"
	"log/slog"
)

// EndpointSlices into the backends table: each slice is one row, its
// service's backends as the slice lists them, replaced whole when the slice
// changes and deleted with it.

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
		w.setSliceBackends(b, SliceKey{ServiceName{Namespace: s.id.Namespace, Name: oldName}, s.id.Name}, nil)
	}
	if s.service.Name == "" {
		w.slices.delete(s.id)
		return
	}
	if !known || oldName != s.service.Name {
		w.slices.set(s.id, s.service.Name)
	}
	if w.log.Enabled(context.Background(), slog.LevelDebug) {
		if _, _, found := w.tables.services.Get(b.txn, ServiceByName.Query(s.service)); !found {
			w.log.Debug("EndpointSlice for a Service not seen yet: keeping its backends until the Service appears",
				"endpointslice", s.id, "service", s.service)
		}
	}
	w.setSliceBackends(b, SliceKey{s.service, s.id.Name}, s.backends)
}

func (w *writer) deleteSlice(b *batch, id sliceID) {
	w.setProblem(sliceProblemKey(id), nil)
	if name, ok := w.slices.get(id); ok {
		w.setSliceBackends(b, SliceKey{ServiceName{Namespace: id.Namespace, Name: name}, id.Name}, nil)
		w.slices.delete(id)
	}
}

// setSliceBackends makes backends (sorted, as conversion leaves them) the
// backends row of the slice, deleting the row when there are none, and
// marks the service dirty if the row changed.
func (w *writer) setSliceBackends(b *batch, key SliceKey, backends []Backend) {
	old, _, found := w.tables.backends.Get(b.txn, BackendsBySlice.Query(key))
	if len(backends) == 0 {
		if found {
			b.deleteBackends(w.tables, old)
			b.markDirty(key.Service)
			w.forgetQuarantined(b, old.Backends)
		}
		return
	}
	row := &SliceBackends{ServiceName: key.Service, EndpointSlice: key.Slice, Backends: w.withQuarantine(backends)}
	if found && old.equal(row) {
		return
	}
	b.insertBackends(w.tables, row)
	b.markDirty(key.Service)
	if found {
		w.forgetQuarantined(b, old.Backends)
	}
}
