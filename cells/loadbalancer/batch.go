package loadbalancer

import (
	"context"
	"slices"

	"github.com/cilium/statedb"
)

// batch is one write transaction and the services whose frontends it must
// recompute before committing.
//
// Queries by service go to the snapshot from before the transaction, plus
// what the transaction itself added, then each hit is read again from the
// transaction by its primary key. Iterating the write transaction instead
// would freeze its trees, and every later insert would copy the path to its
// leaf: several times the cost of the insert itself.
//
// The writer keeps one batch (writer.spare) and reuses its maps from one
// transaction to the next, cleared: transactions follow each other at the
// rate of the events, and three new maps for each were a good part of
// their allocations. Maps a batch grew large are dropped instead (see
// release).
type batch struct {
	ctx      context.Context
	steps    int
	txn      statedb.WriteTxn
	snapshot statedb.ReadTxn
	dirty    map[ServiceName]struct{}
	// frontendsDeleted says whether an address was freed, which may
	// settle a contested one.
	frontendsDeleted bool
	// addedFrontends are the addresses of frontends this transaction
	// inserted, addedBackends the slices of backends rows, by service.
	addedFrontends map[ServiceName][]L3n4Addr
	addedBackends  map[ServiceName][]string
	// backendsWritten says the transaction wrote the backends table: until
	// it does, the snapshot's backends rows are the transaction's (the
	// transactions that compute the frontends of a listing write none).
	backendsWritten bool
}

func (w *writer) newBatch(ctx context.Context, txn statedb.WriteTxn) *batch {
	b := &w.spare
	if b.dirty == nil {
		b.dirty = map[ServiceName]struct{}{}
		b.addedFrontends = map[ServiceName][]L3n4Addr{}
		b.addedBackends = map[ServiceName][]string{}
	}
	b.ctx, b.txn, b.snapshot, b.frontendsDeleted, b.backendsWritten, b.steps = ctx, txn, w.db.ReadTxn(), false, false, 0
	return b
}

// stoppingEvery is how many steps of a batch (services whose frontends are
// computed) go between two looks at its context.
const stoppingEvery = 256

// stopping counts a step and says whether the batch's context has ended,
// looking every stoppingEvery steps.
func (b *batch) stopping() bool {
	b.steps++
	return b.steps%stoppingEvery == 0 && b.ctx.Err() != nil
}

// release lets go of the transaction and the snapshot, which would keep
// old versions of the tables alive, and of maps that a listing grew large:
// clearing a map keeps its memory.
func (b *batch) release() {
	b.ctx, b.txn, b.snapshot = nil, nil, nil
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

func (b *batch) insertBackends(t *lbTables, be *SliceBackends) {
	t.backends.Insert(b.txn, be)
	b.backendsWritten = true
	b.addedBackends[be.ServiceName] = append(b.addedBackends[be.ServiceName], be.EndpointSlice)
}

func (b *batch) deleteBackends(t *lbTables, be *SliceBackends) {
	t.backends.Delete(b.txn, be)
	b.backendsWritten = true
}

// frontendsOf are the service's frontends as of the transaction.
func (b *batch) frontendsOf(t *lbTables, name ServiceName) []*Frontend {
	addrs := slices.Clone(b.addedFrontends[name]) // heldAt sorts it
	// A service's frontends go in the transaction that deletes it: without
	// the service, the snapshot has none of its frontends either. With
	// it, they are at the addresses its row in the snapshot names, or
	// NodePort ones: a transaction leaves every service it changed with
	// the frontends its row and the node's addresses give it.
	if svc, _, found := t.services.Get(b.snapshot, ServiceByName.Query(name)); found {
		addrs = frontendAddrs(b.snapshot, t.frontends, svc, addrs)
	}
	return heldAt(b.txn, t.frontends, name, addrs)
}

// backendsOf are the backends rows of the service as of the transaction.
func (b *batch) backendsOf(t *lbTables, name ServiceName) []*SliceBackends {
	if !b.backendsWritten {
		return slices.Collect(statedb.ToSeq(BackendsOf(b.snapshot, t.backends, name)))
	}
	names := slices.Clip(b.addedBackends[name])
	for be := range BackendsOf(b.snapshot, t.backends, name) {
		names = append(names, be.EndpointSlice)
	}
	var out []*SliceBackends
	for i, slice := range names {
		if slices.Contains(names[:i], slice) {
			continue
		}
		if be, _, found := t.backends.Get(b.txn, BackendsBySlice.Query(SliceKey{name, slice})); found {
			out = append(out, be)
		}
	}
	return out
}
