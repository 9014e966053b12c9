package loadbalancer

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/cellium/cellium/cells/internal/chans"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
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
	slices sliceServices
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
	// are in. Until both are, no frontends are computed: computed from
	// services alone they would reject connections, and the datapath would
	// be programmed twice. Then every service in the table gets its
	// frontends (drainFrom), a batch's worth per transaction. Until the
	// listings are in, the writer has written no frontend, so every
	// service that may need one is in the table: those deleted meanwhile
	// had none.
	servicesListed, slicesListed bool
	// drained says every service in the table when both listings were in
	// has had its frontends computed; until then drainFrom is the last
	// one that has, and the rest follow it in name order. Services
	// changed since are marked dirty as usual. (It was a set of the
	// services that waited, filled during the listings: at 50,000
	// Services growing it was 0.1 s of a restart's CPU.)
	drained   bool
	drainFrom ServiceName
	// frontendsSynced says the frontends table's initializers are done.
	frontendsSynced bool
	// programmed says which frontends the maps hold already (nil: none);
	// syncDeleted are the addresses whose frontend was deleted before
	// frontendsSynced. See heldAlready.
	programmed  Programmed
	syncDeleted map[L3n4Addr]struct{}
	// quarantined are the backend addresses BackendHealth took out of
	// service; see BackendHealth.
	quarantined map[L3n4Addr]struct{}

	// spare is the last batch, whose maps the next one reuses.
	spare batch
}

// update runs fn in a write transaction and then brings the frontends of
// every service fn marked dirty up to date.
//
// A batch is up to maxBatch events and the frontends of up to about as
// many services, tens of milliseconds; when ctx ends in the middle (the
// agent stops), the transaction is abandoned rather than finished, so that
// stopping does not wait for it. The writer is not used again after that.
func (w *writer) update(ctx context.Context, fn func(b *batch)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	txn := w.db.WriteTxn(w.tables.services, w.tables.frontends, w.tables.backends)
	defer txn.Abort()
	b := w.newBatch(ctx, txn)
	defer b.release()
	fn(b)
	listed := w.servicesListed && w.slicesListed
	if !listed {
		clear(b.dirty)
	} else if !w.drained {
		w.drain(b)
	}
	for name := range b.dirty {
		if b.stopping() {
			return
		}
		w.updateFrontends(b, name)
	}
	if b.frontendsDeleted && len(w.contested) > 0 {
		for _, name := range slices.Collect(maps.Keys(w.contested)) {
			w.updateFrontends(b, name)
		}
	}
	if b.ctx.Err() != nil {
		return
	}
	if listed && w.drained && !w.frontendsSynced {
		// The frontends table is complete: every listed service's
		// frontends are in it.
		w.tables.frontendsSynced(txn)
		w.frontendsSynced = true
		w.syncDeleted = nil
	}
	txn.Commit()
	w.reportHealth()
}

// drain marks dirty the services of the table after drainFrom, in name
// order, until the batch has maxBatch (a batch's worth per transaction,
// for the same reason listings are queued per object: see
// servicesListed), and says drained when none is left. It reads the snapshot: services this transaction added are marked
// dirty already, and iterating the write transaction would freeze its
// trees (see batch).
func (w *writer) drain(b *batch) {
	for svc := range w.tables.services.LowerBound(b.snapshot, ServiceByName.Query(w.drainFrom)) {
		if svc.Name == w.drainFrom {
			continue
		}
		if len(b.dirty) >= maxBatch {
			return
		}
		b.markDirty(svc.Name)
		w.drainFrom = svc.Name
	}
	w.drained = true
}

// drainReady says whether services wait for their frontends although
// both listings are in.
func (w *writer) drainReady() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.servicesListed && w.slicesListed && !w.drained
}

// processEvents applies the reflectors' events in batches until ctx ends.
func (w *writer) processEvents(ctx context.Context, events <-chan k8sEvent) {
	pending := make([]k8sEvent, 0, maxBatch)
	for {
		pending = pending[:0]
		if !w.drainReady() {
			select {
			case <-ctx.Done():
				return
			case ev := <-events:
				pending = append(pending, ev)
			}
		} else if ctx.Err() != nil {
			return
		}
		chans.Ready(events, maxBatch-len(pending), func(ev k8sEvent) { pending = append(pending, ev) })
		w.update(ctx, func(b *batch) {
			for _, ev := range pending {
				ev.apply(w, b)
			}
		})
		// Let the converted objects go while waiting for more.
		clear(pending)
	}
}
