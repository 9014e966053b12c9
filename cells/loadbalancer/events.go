package loadbalancer

import (
	"strings"
)

// The events the reflectors queue for the writer, and what applying each
// one does to the services table. EndpointSlices are applied in slices.go.

// k8sEvent is a change from one of the reflectors, already converted.
type k8sEvent interface {
	apply(w *writer, b *batch)
}

type serviceUpserted struct {
	svc     *Service
	invalid []invalidField
}

func (e *serviceUpserted) apply(w *writer, b *batch) { w.upsertService(b, e.svc, e.invalid) }

type serviceDeleted struct{ name ServiceName }

func (e *serviceDeleted) apply(w *writer, b *batch) { w.deleteService(b, e.name) }

// servicesListed ends a complete listing, whose services came before it as
// serviceUpserted events: services not in it are gone. A listing is queued
// as one event per object, so that it is applied in batches like any other
// events: as one transaction, 50,000 Services held the tables' write lock
// for over a second, the lb-maps reconciler waited for it, and so did
// stopping the agent.
type servicesListed struct{ names map[ServiceName]struct{} }

func (e *servicesListed) apply(w *writer, b *batch) {
	var gone []ServiceName
	for svc := range w.tables.services.All(b.txn) {
		if _, ok := e.names[svc.Name]; !ok {
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

type sliceUpserted struct {
	slice   *endpointSlice
	invalid []invalidField
}

func (e *sliceUpserted) apply(w *writer, b *batch) { w.upsertSlice(b, e.slice, e.invalid) }

type sliceDeleted struct{ id sliceID }

func (e *sliceDeleted) apply(w *writer, b *batch) { w.deleteSlice(b, e.id) }

// slicesListed ends a complete listing, whose slices came before it as
// sliceUpserted events: slices not in it are gone.
type slicesListed struct{ ids map[sliceID]struct{} }

func (e *slicesListed) apply(w *writer, b *batch) {
	listed := e.ids
	for id := range w.slices.all() {
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
