package loadbalancer

import (
	"slices"
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
type servicesListed struct{ names *listed[ServiceName] }

func (e *servicesListed) apply(w *writer, b *batch) {
	e.names.sort()
	var gone []ServiceName
	for svc := range w.tables.services.All(b.txn) {
		if !e.names.has(svc.Name) {
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
type slicesListed struct{ ids *listed[sliceID] }

func (e *slicesListed) apply(w *writer, b *batch) {
	listed := e.ids
	listed.sort()
	for id := range w.slices.all() {
		if !listed.has(id) {
			w.deleteSlice(b, id)
		}
	}
	// A slice without a service label is in no map but may have had a
	// problem.
	for key := range w.problems {
		if id, ok := strings.CutPrefix(key, "EndpointSlice "); ok {
			ns, name, _ := strings.Cut(id, "/")
			if !listed.has(sliceID{ns, name}) {
				w.setProblemMessage(key, "")
			}
		}
	}
	w.slicesListed = true
	w.tables.slicesSynced(b.txn)
}

// listed are the names of a listing's objects, for its end to tell which
// rows are gone: appended as the objects come and sorted once at the end,
// in one pass when they came sorted. The API server lists by the key
// "namespace/name", which is namespace-then-name order unless one
// namespace's name extends another's with a character that sorts before
// "/" ("kube" and "kube-system"); then it is a full sort. A set grown one object at a time was ~0.1 s of a
// 50,000-Service restart's CPU, most of it rehashing as it grew.
type listed[K any] struct {
	keys []K
	cmp  func(K, K) int
}

func newListed[K any](cmp func(K, K) int) *listed[K] { return &listed[K]{cmp: cmp} }

// add appends k, doubling the room when it runs out: append grows a large
// slice by a quarter, which at 50,000 names allocated five times their
// size on the way.
func (l *listed[K]) add(k K) {
	if len(l.keys) == cap(l.keys) {
		l.keys = slices.Grow(l.keys, max(len(l.keys), 64))
	}
	l.keys = append(l.keys, k)
}

func (l *listed[K]) len() int { return len(l.keys) }

// sort readies has; adding after it is wrong.
func (l *listed[K]) sort() {
	if l != nil && !slices.IsSortedFunc(l.keys, l.cmp) {
		slices.SortFunc(l.keys, l.cmp)
	}
}

// has says whether k was listed, once sorted.
func (l *listed[K]) has(k K) bool {
	if l == nil {
		return false
	}
	_, found := slices.BinarySearchFunc(l.keys, k, l.cmp)
	return found
}
