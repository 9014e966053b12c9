package lbmaps

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/maglev"
)

// InitRestore is the initializer lb-maps holds on the frontends table until
// it has read the pinned maps: nothing is pruned before that.
const InitRestore = "lb-maps-restore"

type opsParams struct {
	cell.In

	Config     Config
	Log        *slog.Logger
	Lifecycle  cell.Lifecycle
	Shutdowner hive.Shutdowner
	Health     cell.Health
	DB         *statedb.DB
	Maps       *Maps
	Frontends  statedb.RWTable[*loadbalancer.Frontend]
}

// ops programs frontends into the maps. See the package documentation.
type ops struct {
	log      *slog.Logger
	cfg      Config
	v4       *family[lbmap.Service4Key, lbmap.Backend4, lbmap.RevNAT4]
	v6       *family[lbmap.Service6Key, lbmap.Backend6, lbmap.RevNAT6]
	state    *realized
	counters *counters
	// repairs counts and logs the entries restore found and a prune or a
	// round deleted as left over (cellium_kernel_repairs_total).
	repairs *drift.Repairs
	// pruneHealth is "lb-maps.prune": the reconciler's own health shows a
	// failed prune only until its next round reports OK, a millisecond
	// later; this scope keeps it until a prune succeeds.
	pruneHealth cell.Health
	// mu gives the realized state and the rounds to one user at a time:
	// an operation of the reconciler (which calls one at a time), or
	// Holds, which the loadbalancer writer calls.
	mu sync.Mutex
	// r4 and r6 are the rounds, kept between them with their buffers.
	r4      *round[lbmap.Service4Key, lbmap.Backend4, lbmap.RevNAT4]
	r6      *round[lbmap.Service6Key, lbmap.Backend6, lbmap.RevNAT6]
	entries []entry

	db        *statedb.DB
	frontends statedb.RWTable[*loadbalancer.Frontend]
	restored  func(statedb.WriteTxn)

	// restoreDone is closed once restore has read the maps into state,
	// restoreErr set before if it failed. Nothing touches state before.
	restoreDone chan struct{}
	restoreErr  error
	shutdowner  hive.Shutdowner
}

func newOps(p opsParams) *ops {
	o := &ops{
		log:      p.Log,
		cfg:      p.Config,
		v4:       ipv4(p.Maps),
		v6:       ipv6(p.Maps),
		state:    newRealized(min(p.Config.LBRevnatMapMax, 1<<16-1), p.Config.LBBackendMapMax),
		counters: newCounters(),
		repairs:  drift.NewRepairs(p.Log, "lb-maps"),

		pruneHealth: p.Health.NewScope("prune"),

		restoreDone: make(chan struct{}),
		shutdowner:  p.Shutdowner,
	}
	o.r4, o.r6 = newRound(o, o.v4), newRound(o, o.v6)
	txn := p.DB.WriteTxn(p.Frontends)
	o.restored = p.Frontends.RegisterInitializer(txn, InitRestore)
	txn.Commit()
	o.db, o.frontends = p.DB, p.Frontends
	// This hook runs after the maps' own (the constructor takes *Maps).
	// The restore itself runs beside the start hooks after it (reading
	// 100,000 entries takes a few hundred milliseconds, which the
	// manifests' load and the Kubernetes listings need not wait for);
	// every operation waits for it, so every ID in the maps is reserved
	// before one is handed out, and the maps are closed only after it.
	p.Lifecycle.Append(cell.Hook{
		OnStart: func(cell.HookContext) error {
			go o.restore()
			return nil
		},
		OnStop: func(cell.HookContext) error {
			<-o.restoreDone
			return nil
		},
	})
	return o
}

func opsMetrics(o *ops) metrics.Collectors {
	return metrics.NewCollectors(append(o.repairs.Collectors().Collectors, o.counters.writes, o.counters.deletes)...)
}

// restore reads the maps into the realized state and releases the
// frontends table's initializer. A map that cannot be read stops the
// agent with the error, as a failed start hook would: programming
// frontends without knowing the IDs in use could hand one out twice.
func (o *ops) restore() {
	defer close(o.restoreDone)
	start := time.Now()
	var stats restoreStats
	err := restore(o.state, o.v4, &stats)
	if err != nil {
		err = fmt.Errorf("restore IPv4 load-balancing maps: %w", err)
	} else if err = restore(o.state, o.v6, &stats); err != nil {
		err = fmt.Errorf("restore IPv6 load-balancing maps: %w", err)
	}
	o.state.holdOrphanIDs()
	if err != nil {
		o.restoreErr = err
		o.log.Error("Cannot restore load-balancing state, stopping", "error", err)
		o.shutdowner.Shutdown(hive.ShutdownWithError(err))
		return
	}
	o.log.Info("Restored load-balancing state from the pinned maps",
		"frontends", stats.frontends, "backends", stats.backends, "dropped", stats.dropped,
		"duration", time.Since(start))
	txn := o.db.WriteTxn(o.frontends)
	o.restored(txn)
	txn.Commit()
}

// waitRestored waits until restore is done, and says why not to go on: the
// restore failed or ctx ended first.
func (o *ops) waitRestored(ctx context.Context) error {
	select {
	case <-o.restoreDone:
		return o.restoreErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reconciler is the frontends reconciler, for waiting until the maps hold
// a revision of the frontends table (reconciler.Reconciler's
// WaitUntilReconciled).
type Reconciler = reconciler.Reconciler[*loadbalancer.Frontend]

func newReconciler(p reconciler.Params, o *ops, frontends statedb.RWTable[*loadbalancer.Frontend]) (Reconciler, error) {
	return reconciler.Register(p, frontends,
		(*loadbalancer.Frontend).Clone,
		(*loadbalancer.Frontend).SetStatus,
		(*loadbalancer.Frontend).GetStatus,
		o, o,
		reconciler.WithName("frontends"),
	)
}

// FrontendsBarrier is the readiness barrier that waits until every
// frontend is in the maps: the table initialized (Kubernetes synced, the
// maps restored) and each of its frontends then written without error.
const FrontendsBarrier = "lb-frontends-reconciled"

func frontendsReconciled(db *statedb.DB, frontends statedb.RWTable[*loadbalancer.Frontend]) health.WaitOut {
	return health.Reconciled(FrontendsBarrier, db, frontends.ToTable(), (*loadbalancer.Frontend).GetStatus)
}

// Update implements reconciler.Operations through the batch path, so that
// there is one way frontends reach the maps.
func (o *ops) Update(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, fe *loadbalancer.Frontend) error {
	batch := []reconciler.BatchEntry[*loadbalancer.Frontend]{{Object: fe, Revision: rev}}
	o.UpdateBatch(ctx, txn, batch)
	return batch[0].Result
}

func (o *ops) Delete(ctx context.Context, txn statedb.ReadTxn, rev statedb.Revision, fe *loadbalancer.Frontend) error {
	batch := []reconciler.BatchEntry[*loadbalancer.Frontend]{{Object: fe, Revision: rev}}
	o.DeleteBatch(ctx, txn, batch)
	return batch[0].Result
}

func (o *ops) UpdateBatch(ctx context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*loadbalancer.Frontend]) {
	if err := o.waitRestored(ctx); err != nil {
		failBatch(batch, err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	entries := o.newEntries(len(batch))
	r4, r6 := o.r4, o.r6
	for i := range batch {
		fe := batch[i].Object
		if fe.Address.Addr.Is4() {
			r4.update(&entries[i], fe)
		} else {
			r6.update(&entries[i], fe)
		}
	}
	r4.flush()
	r6.flush()
	for i := range batch {
		batch[i].Result = entries[i].err
	}
}

func (o *ops) DeleteBatch(ctx context.Context, _ statedb.ReadTxn, batch []reconciler.BatchEntry[*loadbalancer.Frontend]) {
	if err := o.waitRestored(ctx); err != nil {
		failBatch(batch, err)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	entries := o.newEntries(len(batch))
	r4, r6 := o.r4, o.r6
	for i := range batch {
		addr, ok := keyOf(batch[i].Object.Address)
		switch {
		case !ok:
		case addr.Is4:
			r4.delete(&entries[i], addr)
		default:
			r6.delete(&entries[i], addr)
		}
	}
	r4.flush()
	r6.flush()
	for i := range batch {
		batch[i].Result = entries[i].err
	}
}

// Holds says whether the maps hold fe exactly, so that reconciling it
// would write nothing (loadbalancer.Programmed): its frontend and each of
// its backends have their entries, restored from the pinned maps or
// written since, and an update plans no write. It is the comparison
// Update makes, planned in the round and dropped instead of flushed. It
// never waits: before restore is done, or while a reconciliation round
// has the state, it says false, and fe goes the reconciler's way.
func (o *ops) Holds(fe *loadbalancer.Frontend) bool {
	select {
	case <-o.restoreDone:
	default:
		return false
	}
	if o.restoreErr != nil || !o.mu.TryLock() {
		return false
	}
	defer o.mu.Unlock()
	key, ok := keyOf(fe.Address)
	if !ok {
		// Nothing is written for it (SCTP): an update succeeds at once.
		return true
	}
	// Update would give the frontend or a backend an ID, a state change
	// that dropping the round would not undo: such a frontend is not
	// held anyway.
	if fs, ok := o.state.frontends.Get(key); !ok || fs.id == 0 {
		return false
	}
	for _, be := range fe.Backends {
		k, ok := keyOf(be)
		if !ok {
			return false
		}
		if bs, ok := o.state.backends.Get(k); !ok || !bs.written {
			return false
		}
	}
	var e entry
	if key.Is4 {
		o.r4.update(&e, fe)
		return e.err == nil && o.r4.discard()
	}
	o.r6.update(&e, fe)
	return e.err == nil && o.r6.discard()
}

// newEntries is a round's entries, one per frontend of the batch, in a
// buffer kept between rounds.
func (o *ops) newEntries(n int) []entry {
	o.entries = slices.Grow(o.entries[:0], n)[:n]
	clear(o.entries)
	return o.entries
}

func failBatch(batch []reconciler.BatchEntry[*loadbalancer.Frontend], err error) {
	for i := range batch {
		batch[i].Result = err
	}
}

// Prune removes what the maps hold for frontends that are not wanted: those
// deleted while the agent was down, and leftovers found at restore. The
// reconciler calls it only once the frontends table is initialized, that
// is after Kubernetes state has synced and restore is done.
func (o *ops) Prune(ctx context.Context, _ statedb.ReadTxn, objects iter.Seq2[*loadbalancer.Frontend, statedb.Revision]) error {
	// The table's initializer is released only after restore, so this
	// returns at once; it is here so that state is never read before.
	if err := o.waitRestored(ctx); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	wanted := map[addrKey]struct{}{}
	for fe := range objects {
		if addr, ok := keyOf(fe.Address); ok {
			wanted[addr] = struct{}{}
		}
	}
	var staleAddrs []addrKey
	for addr := range o.state.frontends.All() {
		if _, ok := wanted[addr]; !ok {
			staleAddrs = append(staleAddrs, addr)
		}
	}
	// Sized before the first delete is planned: the round holds pointers
	// into it.
	stale := make([]entry, len(staleAddrs))
	r4, r6 := o.r4, o.r6
	for i, addr := range staleAddrs {
		if addr.Is4 {
			r4.delete(&stale[i], addr)
		} else {
			r6.delete(&stale[i], addr)
		}
	}
	// Backends no written slot points at: left over at restore, or whose
	// delete failed in an earlier round; and the strays nothing points at.
	unused := func(bs *backendState) {
		if bs.refs == 0 {
			if bs.addr.Is4 {
				r4.unused[bs] = true
			} else {
				r6.unused[bs] = true
			}
		}
	}
	for _, bs := range o.state.backends.All() {
		unused(bs)
	}
	for _, s := range o.state.strays {
		unused(s.bs)
	}
	r4.flush()
	r6.flush()

	var errs []error
	for i, e := range stale {
		if e.err != nil {
			errs = append(errs, fmt.Errorf("remove stale frontend %s: %w", describe(staleAddrs[i]), e.err))
		}
	}
	// Leftovers of restore; their IDs are freed once they are gone.
	left := o.state.orphans[:0]
	for _, orphan := range o.state.orphans {
		switch err := orphan.remove(); {
		case err == nil:
			o.repairs.Removed(orphan.object, orphan.what, orphan.where, orphan.why)
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			errs = append(errs, fmt.Errorf("remove leftover entry at frontend ID %d: %w", orphan.id, err))
			left = append(left, orphan)
		}
	}
	clear(o.state.orphans[len(left):])
	o.state.orphans = left
	o.state.releaseOrphanIDs()
	err := errors.Join(errs...)
	if err != nil {
		o.pruneHealth.Degraded("Stale entries left in the load-balancing maps; tried again at the next prune", err)
	} else {
		o.pruneHealth.OK(fmt.Sprintf("Last prune removed %d stale frontends", len(stale)))
	}
	if len(stale) > 0 {
		o.log.Info("Pruned stale frontends from the load-balancing maps", "frontends", len(stale), "failed", len(errs))
	}
	return err
}

// round is one family's writes of one reconciliation round, issued in the
// order that keeps the datapath consistent at every moment: backends before
// the slots that point at them, slots before the master entry that counts
// them, the master before slots beyond its count are deleted, and backends
// last, once no slot points at them.
type round[SK comparable, B, R any] struct {
	o *ops
	f *family[SK, B, R]

	backendPuts puts[lbmap.BackendID, B]
	slotPuts    puts[SK, lbmap.ServiceValue]
	masterPuts  puts[SK, lbmap.ServiceValue]
	revNATPuts  puts[lbmap.RevNATIndex, R]
	// maglevOps replace or delete Maglev tables, one map-in-map swap each.
	maglevOps     []func()
	masterDeletes deletes[SK, lbmap.ServiceValue]
	slotDeletes   deletes[SK, lbmap.ServiceValue]
	revNATDeletes deletes[lbmap.RevNATIndex, R]
	backendDels   deletes[lbmap.BackendID, B]

	// queued are backends whose entry this round writes.
	queued map[*backendState]bool
	// unused are backends that may have lost their last reference.
	unused map[*backendState]bool
	// deleted are frontends being deleted: forgotten once empty.
	deleted map[addrKey]*frontendState
	// ids is update's buffer for a frontend's backend IDs.
	ids []lbmap.BackendID

	// The record functions of the writes that need the round's family.
	wroteSlot      func(mark, lbmap.ServiceValue)
	deletedSlot    func(mark)
	deletedBackend func(mark)
}

func newRound[SK comparable, B, R any](o *ops, f *family[SK, B, R]) *round[SK, B, R] {
	r := &round[SK, B, R]{
		o: o, f: f,
		queued:  map[*backendState]bool{},
		unused:  map[*backendState]bool{},
		deleted: map[addrKey]*frontendState{},
	}
	st := o.state
	r.wroteSlot = func(m mark, v lbmap.ServiceValue) {
		st.slotWritten(f.is4, m.fs, m.slot, v.BackendID)
		r.releaseUntrusted(m)
	}
	r.deletedSlot = func(m mark) {
		st.slotDeleted(f.is4, m.fs, m.slot)
		r.releaseUntrusted(m)
	}
	r.deletedBackend = func(m mark) {
		if m.bs.stray {
			s := st.strays[strayKey{m.bs.id, f.is4}]
			o.repairs.Removed("lb-backend", s.what, f.backends.Name(), s.why)
		}
		st.forgetBackend(m.bs)
	}
	return r
}

// releaseUntrusted notes that the slot of m, rewritten or deleted, no
// longer holds the backend it pointed at when restore did not trust it.
func (r *round[SK, B, R]) releaseUntrusted(m mark) {
	if bs := r.o.state.releaseUntrusted(m.fs, m.slot); bs != nil {
		r.unused[bs] = true
	}
}

// maglevReplaced notes that fs's Maglev table was replaced or deleted:
// the strays its restored table pointed at may be unused now.
func (r *round[SK, B, R]) maglevReplaced(fs *frontendState) {
	for _, bs := range r.o.state.maglevReplaced(fs) {
		r.unused[bs] = true
	}
}

// update plans the writes that make the maps hold fe, and only those.
func (r *round[SK, B, R]) update(e *entry, fe *loadbalancer.Frontend) {
	st := r.o.state
	key, ok := keyOf(fe.Address)
	if !ok {
		// The socket programs do not balance SCTP: nothing to write.
		return
	}
	proto := lbmap.Proto(key.Proto)
	fs, err := st.frontend(key)
	if err != nil {
		e.fail(err)
		return
	}

	ids := slices.Grow(r.ids[:0], len(fe.Backends))[:len(fe.Backends)]
	r.ids = ids
	for i, be := range fe.Backends {
		beKey, ok := keyOf(be)
		if !ok || beKey.Is4 != key.Is4 {
			e.fail(fmt.Errorf("backend %s cannot serve frontend %s", be, fe.Address))
			return
		}
		bs, err := st.backend(beKey)
		if err != nil {
			e.fail(err)
			return
		}
		if !bs.written && !r.queued[bs] {
			r.queued[bs] = true
			r.backendPuts.add(e, bs.id, r.f.backend(be.Addr, be.Port, lbmap.Proto(beKey.Proto)), mark{bs: bs})
		}
		ids[i] = bs.id
	}

	addr, port := fe.Address.Addr, fe.Address.Port
	for i, id := range ids {
		if i < len(fs.slots) && fs.slots[i] == id {
			continue
		}
		if i < len(fs.slots) {
			r.noteUnused(fs.slots[i])
		}
		n := i + 1
		r.slotPuts.add(e, r.f.serviceKey(addr, port, proto, uint16(n)), lbmap.NewServiceSlot(id, fs.id),
			mark{fs: fs, slot: n})
	}

	var flags lbmap.ServiceFlags
	if fe.SessionAffinity {
		flags |= lbmap.ServiceAffinity
	}
	if fe.Type == loadbalancer.FrontendNodePort && addr.IsUnspecified() {
		flags |= lbmap.ServiceNodePortWildcard
	}
	if fe.TrafficPolicyLocal {
		flags |= lbmap.ServiceLocal
	}
	useMaglev := r.o.cfg.LBAlgorithm == AlgorithmMaglev && len(ids) > 0
	if useMaglev {
		flags |= lbmap.ServiceMaglev
	}
	master := lbmap.NewServiceMaster(uint16(len(ids)), fs.id, flags, fe.AffinityTimeout)
	if !fs.hasMaster || fs.master != master {
		r.masterPuts.add(e, r.f.serviceKey(addr, port, proto, 0), master, mark{fs: fs})
	}
	if !fs.revNAT {
		r.revNATPuts.add(e, fs.id, r.f.revNATOf(addr, port), mark{fs: fs})
	}

	switch {
	case useMaglev:
		table, err := r.maglevTable(fe.Backends, ids)
		if err != nil {
			e.fail(err)
			return
		}
		if h := maglevHash(table); h != fs.maglev {
			r.maglevOps = append(r.maglevOps, func() {
				if err := r.f.maglev.Put(fs.id, table); err != nil {
					e.fail(err)
					return
				}
				r.o.counters.wrote(r.f.maglev.Name(), 1)
				fs.maglev = h
				r.maglevReplaced(fs)
			})
		}
	case fs.maglev != 0:
		r.maglevOps = append(r.maglevOps, func() {
			if err := r.f.maglev.Delete(fs.id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				e.fail(err)
				return
			}
			r.o.counters.deleted(r.f.maglev.Name(), 1)
			fs.maglev = 0
			r.maglevReplaced(fs)
		})
	}

	for n := len(ids) + 1; n <= len(fs.slots); n++ {
		if fs.slots[n-1] == 0 {
			continue
		}
		r.noteUnused(fs.slots[n-1])
		r.slotDeletes.add(e, r.f.serviceKey(addr, port, proto, uint16(n)), mark{fs: fs, slot: n})
	}
}

// delete plans the removal of everything written for addr.
func (r *round[SK, B, R]) delete(e *entry, addr addrKey) {
	st := r.o.state
	fs, ok := st.frontends.Get(addr)
	if !ok {
		return
	}
	r.deleted[addr] = fs
	ip, port, proto := addr.IP(), addr.Port, lbmap.Proto(addr.Proto)
	if fs.hasMaster {
		r.masterDeletes.add(e, r.f.serviceKey(ip, port, proto, 0), mark{fs: fs})
	}
	for i, id := range fs.slots {
		if id == 0 {
			continue
		}
		n := i + 1
		r.noteUnused(id)
		r.slotDeletes.add(e, r.f.serviceKey(ip, port, proto, uint16(n)), mark{fs: fs, slot: n})
	}
	// The reverse NAT entry at the frontend's ID is its own whatever it
	// holds: one restore found holding another address (fs.revNAT false)
	// goes too. Deleting one that is not there succeeds.
	if fs.id != 0 {
		r.revNATDeletes.add(e, fs.id, mark{fs: fs})
	}
	if fs.maglev != 0 {
		r.maglevOps = append(r.maglevOps, func() {
			if err := r.f.maglev.Delete(fs.id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				e.fail(err)
				return
			}
			r.o.counters.deleted(r.f.maglev.Name(), 1)
			fs.maglev = 0
			r.maglevReplaced(fs)
		})
	}
}

func (r *round[SK, B, R]) noteUnused(id lbmap.BackendID) {
	if bs := r.o.state.byID(r.f.is4, id); bs != nil {
		r.unused[bs] = true
	}
}

// maglevTable is the Maglev table of a frontend's backends. The identities
// are the backends' addresses, the same on every node and across restarts,
// so every node and every run computes the same table.
func (r *round[SK, B, R]) maglevTable(backends []loadbalancer.L3n4Addr, ids []lbmap.BackendID) ([]lbmap.BackendID, error) {
	identities := make([]string, len(backends))
	for i, be := range backends {
		identities[i] = be.String()
	}
	slots, err := maglev.Table(identities, r.f.maglev.TableSize())
	if err != nil {
		return nil, err
	}
	table := make([]lbmap.BackendID, len(slots))
	for i, s := range slots {
		table[i] = ids[s]
	}
	return table, nil
}

func (r *round[SK, B, R]) flush() {
	c, st := r.o.counters, r.o.state
	r.backendPuts.flush(r.f.backends, c, wroteBackend[B])
	r.slotPuts.flush(r.f.services, c, r.wroteSlot)
	r.masterPuts.flush(r.f.services, c, wroteMaster)
	r.revNATPuts.flush(r.f.revNAT, c, wroteRevNAT[R])
	for _, op := range r.maglevOps {
		op()
	}
	r.masterDeletes.flush(r.f.services, c, deletedMaster)
	r.slotDeletes.flush(r.f.services, c, r.deletedSlot)
	r.revNATDeletes.flush(r.f.revNAT, c, deletedRevNAT)

	for addr, fs := range r.deleted {
		if fs.empty() {
			st.forgetFrontend(addr, fs)
		}
	}
	for bs := range r.queued {
		r.unused[bs] = true
	}
	for bs := range r.unused {
		switch {
		case bs.refs > 0:
		case !bs.written:
			st.forgetBackend(bs)
		default:
			// A failed delete is not a frontend's failure: their entries
			// are gone. The backend stays known and the next prune retries.
			r.backendDels.add(nil, bs.id, mark{bs: bs})
		}
	}
	r.backendDels.flush(r.f.backends, c, r.deletedBackend)

	r.reset()
}

// discard drops what the round planned, writing nothing, and says whether
// it had planned nothing.
func (r *round[SK, B, R]) discard() (none bool) {
	none = len(r.backendPuts.keys)+len(r.slotPuts.keys)+len(r.masterPuts.keys)+len(r.revNATPuts.keys)+
		len(r.maglevOps)+len(r.masterDeletes.keys)+len(r.slotDeletes.keys)+len(r.revNATDeletes.keys)+
		len(r.backendDels.keys) == 0
	r.backendPuts.reset()
	r.slotPuts.reset()
	r.masterPuts.reset()
	r.revNATPuts.reset()
	r.masterDeletes.reset()
	r.slotDeletes.reset()
	r.revNATDeletes.reset()
	r.backendDels.reset()
	r.reset()
	return none
}

// reset empties the round for the next one. Clearing a map keeps its
// memory: maps a round grew beyond keptWrites are made anew.
func (r *round[SK, B, R]) reset() {
	clear(r.maglevOps)
	r.maglevOps = r.maglevOps[:0]
	if len(r.queued) > keptWrites || len(r.unused) > keptWrites || len(r.deleted) > keptWrites {
		r.queued, r.unused, r.deleted = map[*backendState]bool{}, map[*backendState]bool{}, map[addrKey]*frontendState{}
		return
	}
	clear(r.queued)
	clear(r.unused)
	clear(r.deleted)
}

// counters count the entries written and deleted, per map: what a restart
// that changes nothing must leave at zero.
type counters struct {
	writes, deletes *prometheus.CounterVec
}

func newCounters() *counters {
	return &counters{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "lbmaps", Name: "writes_total",
			Help: "Entries written to the load-balancing maps",
		}, []string{"map"}),
		deletes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "lbmaps", Name: "deletes_total",
			Help: "Entries deleted from the load-balancing maps",
		}, []string{"map"}),
	}
}

func (c *counters) wrote(m string, n int) {
	if n > 0 {
		c.writes.WithLabelValues(m).Add(float64(n))
	}
}

func (c *counters) deleted(m string, n int) {
	if n > 0 {
		c.deletes.WithLabelValues(m).Add(float64(n))
	}
}
