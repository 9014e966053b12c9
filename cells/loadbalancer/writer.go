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
	// are in. Until both are, frontends wait in deferred: computed from
	// services alone they would reject connections, and the datapath would
	// be programmed twice.
	servicesListed, slicesListed bool
	deferred                     map[ServiceName]struct{}
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
		maps.Copy(w.deferred, b.dirty)
		clear(b.dirty)
	} else {
		// The services that waited for both listings, a batch's worth
		// per transaction, for the same reason listings are queued per
		// object (see servicesListed).
		anyDeferred := len(w.deferred) > 0
		for name := range w.deferred {
			if len(b.dirty) >= maxBatch {
				break
			}
			b.markDirty(name)
			delete(w.deferred, name)
		}
		if anyDeferred && len(w.deferred) == 0 {
			// A map keeps the room its largest size took: with every
			// service deferred through the initial listings, that is a
			// few MB for as long as the agent runs.
			w.deferred = map[ServiceName]struct{}{}
		}
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
	if listed && len(w.deferred) == 0 && !w.frontendsSynced {
		// The frontends table is complete: every listed service's
		// frontends are in it.
		w.tables.frontendsSynced(txn)
		w.frontendsSynced = true
		w.syncDeleted = nil
	}
	txn.Commit()
	w.reportHealth()
}

// deferredReady says whether services wait for their frontends although
// both listings are in.
func (w *writer) deferredReady() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.servicesListed && w.slicesListed && len(w.deferred) > 0
}

// processEvents applies the reflectors' events in batches until ctx ends.
func (w *writer) processEvents(ctx context.Context, events <-chan k8sEvent) {
	pending := make([]k8sEvent, 0, maxBatch)
	for {
		pending = pending[:0]
		if !w.deferredReady() {
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
