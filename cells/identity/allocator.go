package identity

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// Allocator gives label sets their identities. Each Allocate is matched by
// a Release when the endpoint that asked goes; an identity lives while a
// local endpoint uses it (and, cluster-wide, while any node does).
//
// With the kvstore, an identity is the number every node gets for the same
// label set (see allocateCluster). Without it, numbers come from the local
// range and are checkpointed in the state dir before they are handed out.
type Allocator struct {
	log    *slog.Logger
	db     *statedb.DB
	tbl    statedb.RWTable[*Identity]
	filter labelFilter
	kv     kvstore.Client
	mode   Mode
	// gcInterval is --identity-gc-interval.
	gcInterval time.Duration
	// crd is the crd mode's state (nil in the other modes).
	crd *crdBackend
	// backendState is how far the store is followed (Backend).
	backendState atomic.Pointer[string]
	node         string
	path         string
	health       cell.Health
	// repairs counts master and value keys written back.
	repairs *kvsync.Repairs

	// mu guards used; a use or release of an identity that stays in use
	// needs only its read lock (the count is atomic).
	mu sync.RWMutex
	// sets serializes this node's allocations and releases of each label
	// set.
	sets keyedMutex
	// gcCandidates are the master keys the last GC round found unused.
	gcCandidates map[string]gcCandidate

	// used are the identities of this node's endpoints by canonical label
	// string; restored local identities wait here with refs 0 until
	// RestoreDone.
	used map[string]*usedIdentity
	// refsChanged wakes the job identity-refs, which writes the counts
	// of the rows whose count moved between nonzero values.
	refsChanged chan struct{}
	writeBacks  writeBacks
}

// usedIdentity is an identity of this node's endpoints and its count of
// users. A use or a release that leaves the count nonzero changes only the
// count, under a.mu's read lock, and marks the row stale: the job
// identity-refs writes it. Changes from or to zero go to the table at once.
type usedIdentity struct {
	id     identity.NumericIdentity
	labels labels.Labels
	kind   Kind
	source Source
	refs   atomic.Int64
	// stale says the row's Refs lag refs.
	stale atomic.Bool
}

func newUsedIdentity(id identity.NumericIdentity, ls labels.Labels, src Source, refs int64) *usedIdentity {
	u := &usedIdentity{id: id, labels: ls, kind: src.kind(), source: src}
	u.refs.Store(refs)
	return u
}

// row is u's row of the table now.
func (u *usedIdentity) row() *Identity {
	return &Identity{ID: u.id, Labels: u.labels, Kind: u.kind, Source: u.source, Refs: int(u.refs.Load())}
}

// Allocate is the identity of a label set, counted as one more user. An
// empty set is the init identity (the pod's labels are not known yet).
// With the kvstore and etcd away it fails when ctx ends; callers that
// must not wait fall back with Lookup, or to identity.Init.
func (a *Allocator) Allocate(ctx context.Context, ls labels.Labels) (identity.NumericIdentity, error) {
	if len(ls) == 0 {
		return identity.Init, nil
	}
	key := ls.String()
	if id, ok := a.useKnown(key); ok {
		return id, nil
	}
	if a.mode == ModeLocal {
		return a.allocateLocal(ls)
	}
	// This node's allocations and releases of one label set go one at a
	// time: a release deleting the value key must not race an allocation
	// writing it.
	unlock := a.sets.lock(key)
	defer unlock()
	if id, ok := a.useKnown(key); ok {
		return id, nil
	}
	var n identity.NumericIdentity
	var err error
	src := SourceKVStore
	if a.mode == ModeCRD {
		n, err = a.allocateCRD(ctx, ls)
		src = SourceCRD
	} else {
		n, err = a.allocateCluster(ctx, key)
	}
	if err != nil {
		return 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := newUsedIdentity(n, ls, src, 1)
	a.used[key] = u
	a.publish(u)
	return n, nil
}

// useKnown counts one more user of a label set this node already uses,
// under the read lock: parallel uses of one label set do not queue. Only
// the first user of a restored identity writes the row at once.
func (a *Allocator) useKnown(key string) (identity.NumericIdentity, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	u := a.used[key]
	if u == nil {
		return 0, false
	}
	if u.refs.Add(1) == 1 {
		a.publish(u)
	} else {
		a.markStale(u)
	}
	return u.id, true
}

// markStale has the job identity-refs write u's count.
func (a *Allocator) markStale(u *usedIdentity) {
	if u.stale.Swap(true) {
		return
	}
	select {
	case a.refsChanged <- struct{}{}:
	default:
	}
}

// publishRefs writes the counts of the stale rows, all in one
// transaction, whenever some are.
func (a *Allocator) publishRefs(ctx context.Context, _ cell.Health) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.refsChanged:
		}
		// The read lock: an identity released to zero meanwhile has its
		// row written or deleted under the write lock, before or after.
		a.mu.RLock()
		txn := a.db.WriteTxn(a.tbl)
		for _, u := range a.used {
			if u.stale.Swap(false) {
				a.tbl.Insert(txn, u.row())
			}
		}
		txn.Commit()
		a.mu.RUnlock()
	}
}

// WaitSynced waits until the table has every identity the node can know
// of: with the kvstore, until the master keys are listed.
func (a *Allocator) WaitSynced(ctx context.Context) error {
	return tables.WaitInitialized(ctx, a.db, a.tbl)
}

// Lookup is the identity the table knows for a label set, with no kvstore
// round trip.
func (a *Allocator) Lookup(ls labels.Labels) (identity.NumericIdentity, bool) {
	key := ls.String()
	a.mu.RLock()
	u := a.used[key]
	a.mu.RUnlock()
	if u != nil {
		return u.id, true
	}
	// The lowest number, when two name the set (see lookupCluster).
	id, _, found := a.tbl.Get(a.db.ReadTxn(), ByLabels.Query(key))
	if !found {
		return 0, false
	}
	return id.ID, true
}

// Release drops one user of id; the last one frees it (local), or deletes
// this node's value key (kvstore).
func (a *Allocator) Release(ctx context.Context, n identity.NumericIdentity) error {
	if n.IsReserved() || n == identity.Unknown {
		return nil
	}
	if a.releaseNonzero(n) {
		return nil
	}
	a.mu.Lock()
	id := a.usedByID(n)
	if id == nil || id.refs.Load() == 0 {
		a.mu.Unlock()
		return fmt.Errorf("release identity %d: not in use on this node", n)
	}
	if id.refs.Add(-1) > 0 {
		a.markStale(id)
		a.mu.Unlock()
		return nil
	}
	a.publish(id)
	key := id.labels.String()
	if id.kind == KindLocal {
		defer a.mu.Unlock()
		delete(a.used, key)
		a.unpublish(id)
		if err := a.writeCheckpoint(); err != nil {
			return fmt.Errorf("release identity %d: %w", n, err)
		}
		return nil
	}
	a.mu.Unlock()

	unlock := a.sets.lock(key)
	defer unlock()
	a.mu.Lock()
	if id.refs.Load() > 0 || a.used[key] != id {
		// Used again meanwhile.
		a.mu.Unlock()
		return nil
	}
	delete(a.used, key)
	a.unpublish(id)
	a.mu.Unlock()
	if a.mode != ModeKVStore {
		// The CelliumEndpoint objects say who uses an identity (crd).
		return nil
	}
	if err := a.kv.Delete(ctx, a.valueKey(key)); err != nil {
		return fmt.Errorf("release identity %d: %w", n, err)
	}
	return nil
}

// releaseNonzero drops one user of n under the read lock if others
// remain, and reports whether it did.
func (a *Allocator) releaseNonzero(n identity.NumericIdentity) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	u := a.usedByID(n)
	if u == nil {
		return false
	}
	for {
		refs := u.refs.Load()
		if refs <= 1 {
			return false
		}
		if u.refs.CompareAndSwap(refs, refs-1) {
			a.markStale(u)
			return true
		}
	}
}

// usedByID is the identity n of this node's endpoints, with a.mu held.
func (a *Allocator) usedByID(n identity.NumericIdentity) *usedIdentity {
	for _, u := range a.used {
		if u.id == n {
			return u
		}
	}
	return nil
}

// publish writes u's row; unpublish removes a local one (a cluster
// identity stays while its master key does).
func (a *Allocator) publish(u *usedIdentity) {
	txn := a.db.WriteTxn(a.tbl)
	u.stale.Store(false)
	a.tbl.Insert(txn, u.row())
	txn.Commit()
}

func (a *Allocator) unpublish(u *usedIdentity) {
	txn := a.db.WriteTxn(a.tbl)
	if u.kind == KindLocal {
		a.tbl.Delete(txn, u.row())
	} else {
		a.tbl.Insert(txn, u.row())
	}
	txn.Commit()
}
