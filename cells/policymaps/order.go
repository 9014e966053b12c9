package policymaps

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/policymap"
)

// order orders the writes of an endpoint's enforcement (whether it is
// isolated, one reconciler) and its allows (another), so that an agent
// killed at any point leaves each endpoint enforcing its old policy or its
// new one, never dropping traffic both allow:
//
//   - enforcement turns a direction on only once the endpoint's allows are
//     written: its Update waits until none of the endpoint's entries, and no
//     ipBlock prefix, is Pending (an entry that failed, the full map, does
//     not hold it back: its endpoint then denies more than its policy, as
//     documented); a row that moved on meanwhile is not written (write
//     checks its revision), the newer one is reconciled next;
//   - an allow of a direction the endpoint stops being isolated in is
//     removed only after its enforcement is off in the map: the entry's
//     Delete, finding the map still on where the table says off, holds its
//     keys back (held), as do a prefix's Delete and the prune at a restart,
//     and the enforcement's Update removes them right after writing the
//     flags off.
//
// The entries reconciler never waits, so the enforcement's wait always
// ends. mu makes the entries' check of the map and the enforcement's write
// with its removal of the held keys one step each, so that no key is held
// after the write that would remove it.
type order struct {
	db          *statedb.DB
	entries     statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]
	prefixes    statedb.Table[*policy.Prefix]
	enf         *bpfmaps.Map[uint32, policymap.Enforcement]
	trie        *bpfmaps.Map[policymap.Key, policymap.Value]
	prefixMap   *bpfmaps.Map[policymap.PrefixKey, policymap.PrefixValue]
	metrics     *mapMetrics

	mu sync.Mutex
	// held are the keys of removed allows kept in the trie until their
	// endpoint's enforcement is off, by endpoint.
	held map[uint16]map[policymap.Key]bool
	// heldPrefixes are the prefixes no row wants kept in the prefix trie
	// until no endpoint's isolation is to turn off.
	heldPrefixes map[netip.Prefix]bool
}

// waitAllows waits until none of endpoint id's entries is Pending, nor
// any prefix (ipBlock allows match the IDs the prefix map gives addresses;
// the table is small, so any prefix rather than the endpoint's), or ctx
// ends. It says false, without waiting further, once the endpoint's
// enforcement row is no longer at revision rev (the one being reconciled):
// the allows it waits for may be gone, and the newer row is reconciled
// next.
func (o *order) waitAllows(ctx context.Context, id uint16, rev statedb.Revision) (bool, error) {
	counted := false
	defer func() {
		if counted {
			o.metrics.held.WithLabelValues("enforcement").Dec()
		}
	}()
	for {
		txn := o.db.ReadTxn()
		_, cur, rowWatch, found := o.enforcement.GetWatch(txn, policy.EnforcementByEndpoint.Query(id))
		if !found || cur != rev {
			return false, nil
		}
		entries, watch := o.entries.ListWatch(txn, policy.EntryByEndpoint.Query(id))
		pending := 0
		for e := range entries {
			if e.Status.Kind == reconciler.StatusKindPending {
				pending++
			}
		}
		prefixes, prefixWatch := o.prefixes.AllWatch(txn)
		pendingPrefixes := 0
		for p := range prefixes {
			if p.Status.Kind == reconciler.StatusKindPending {
				pendingPrefixes++
			}
		}
		if pending == 0 && pendingPrefixes == 0 {
			return true, nil
		}
		if !counted {
			counted = true
			o.metrics.held.WithLabelValues("enforcement").Inc()
		}
		if o.metrics.waiting != nil {
			o.metrics.waiting(id, pending, pendingPrefixes)
		}
		select {
		case <-watch:
		case <-rowWatch:
		case <-prefixWatch:
		case <-ctx.Done():
			return false, fmt.Errorf("endpoint %d: its enforcement waits for %d allows and %d prefixes to be written: %w",
				id, pending, pendingPrefixes, ctx.Err())
		}
	}
}

// holdKeys holds back the removal of keys, the allows of endpoint id in
// direction dir that no entry wants any more, if the endpoint's
// enforcement in the map is on in dir while its row in txn (the entries
// reconciler's, in which the allows are gone) says off: they are removed
// once it is off (see releaseLocked). It says whether it held them.
func (o *order) holdKeys(txn statedb.ReadTxn, id uint16, dir policy.Direction, keys []policymap.Key) (bool, error) {
	if len(keys) == 0 {
		return false, nil
	}
	bit := policymap.FlagIngress
	if dir == policy.Egress {
		bit = policymap.FlagEgress
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.holdLocked(txn, id, bit, keys)
}

// keepPruned says whether the entries' prune keeps k, which no entry
// wants: if it is held, or holdKeys would hold it now (its endpoint
// isolated in k's direction in the map while its row in txn says open, as
// an agent killed while it held keys, or one whose policy opened while it
// was down, leaves it). A key it keeps so is held: the enforcement's write
// removes it. A failed look-up keeps it, for the next prune.
func (o *order) keepPruned(txn statedb.ReadTxn, k policymap.Key) bool {
	id := k.Endpoint()
	bit := policymap.FlagIngress
	if k.Direction == policymap.Egress {
		bit = policymap.FlagEgress
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.held[id][k] {
		return true
	}
	held, err := o.holdLocked(txn, id, bit, []policymap.Key{k})
	return held || err != nil
}

// holdLocked is holdKeys for the enforcement flag bit, with o.mu held.
func (o *order) holdLocked(txn statedb.ReadTxn, id uint16, bit uint8, keys []policymap.Key) (bool, error) {
	cur, err := o.enf.Lookup(uint32(id))
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("endpoint %d: look up its enforcement: %w", id, err)
	case cur.Flags&bit == 0:
		return false, nil
	}
	row, _, found := o.enforcement.Get(txn, policy.EnforcementByEndpoint.Query(id))
	if !found || flagsOf(row)&bit != 0 {
		// Still isolated (a narrower policy), or the endpoint is gone:
		// nothing the old and new policy both allow is lost.
		return false, nil
	}
	if o.held[id] == nil {
		o.held[id] = map[policymap.Key]bool{}
	}
	for _, k := range keys {
		if !o.held[id][k] {
			o.held[id][k] = true
			o.metrics.held.WithLabelValues("allows").Inc()
		}
	}
	return true, nil
}

// write writes want as endpoint id's enforcement if its row is still at
// revision rev (the one being reconciled) and the map holds something else,
// then removes the keys held for it that no entry of it wants. A row that
// moved on writes nothing: what it wanted may no longer be in order with
// the allows (an isolation whose allows were removed since), and the newer
// row is reconciled next. It says whether it wrote.
func (o *order) write(id uint16, rev statedb.Revision, want policymap.Enforcement) (bool, error) {
	got, err := o.enf.Lookup(uint32(id))
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, fmt.Errorf("endpoint %d: look up its enforcement: %w", id, err)
	}
	put := err != nil || got != want
	if put {
		o.metrics.writing("enforcement", "update")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, cur, found := o.enforcement.Get(o.db.ReadTxn(), policy.EnforcementByEndpoint.Query(id)); !found || cur != rev {
		return false, nil
	}
	if put {
		if err := o.enf.Put(uint32(id), want); err != nil {
			return false, fmt.Errorf("endpoint %d: write its enforcement: %w", id, err)
		}
		o.metrics.wrote("enforcement", "update")
	}
	return put, o.releaseLocked(id)
}

// remove removes endpoint id's enforcement (its row is gone), then the
// keys held for it that no entry of it wants.
func (o *order) remove(id uint16) error {
	o.metrics.writing("enforcement", "delete")
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.enf.Delete(uint32(id)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("endpoint %d: delete its enforcement: %w", id, err)
	} else if err == nil {
		o.metrics.wrote("enforcement", "delete")
	}
	return o.releaseLocked(id)
}

// turningOffLocked says whether some endpoint's isolation is on in the
// map in a direction its row in txn says off, with o.mu held.
func (o *order) turningOffLocked(txn statedb.ReadTxn) (bool, error) {
	off := false
	err := o.enf.Iterate(func(id uint32, v policymap.Enforcement) bool {
		row, _, found := o.enforcement.Get(txn, policy.EnforcementByEndpoint.Query(uint16(id)))
		off = found && v.Flags&^flagsOf(row) != 0
		return !off
	})
	if err != nil {
		return false, fmt.Errorf("list the endpoints' enforcement: %w", err)
	}
	return off, nil
}

// holdPrefix holds back the removal of prefix p, which no row of txn (the
// prefixes reconciler's) wants, while some endpoint's isolation is to turn
// off: the allows it keeps until then may name p's ID, which addresses
// match only through p. It says whether it held p (kept on a failed look
// up, for the next try).
func (o *order) holdPrefix(txn statedb.ReadTxn, p netip.Prefix) (bool, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.heldPrefixes[p] {
		return true, nil
	}
	off, err := o.turningOffLocked(txn)
	if err != nil || !off {
		return false, err
	}
	o.heldPrefixes[p] = true
	o.metrics.held.WithLabelValues("prefixes").Inc()
	return true, nil
}

// releasePrefixesLocked removes the held prefixes that no row wants once
// no endpoint's isolation is to turn off, with o.mu held.
func (o *order) releasePrefixesLocked() error {
	if len(o.heldPrefixes) == 0 {
		return nil
	}
	txn := o.db.ReadTxn()
	if off, err := o.turningOffLocked(txn); err != nil || off {
		return err
	}
	for p := range o.heldPrefixes {
		if _, _, found := o.prefixes.Get(txn, policy.PrefixByPrefix.Query(p)); !found {
			o.metrics.writing("prefix", "delete")
			if err := o.prefixMap.Delete(policymap.PrefixKeyOf(p)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("policy prefix %s: delete it, held until no isolation was to turn off: %w", p, err)
			} else if err == nil {
				o.metrics.wrote("prefix", "delete")
			}
		}
		delete(o.heldPrefixes, p)
		o.metrics.held.WithLabelValues("prefixes").Dec()
	}
	return nil
}

// releaseLocked removes the keys held for endpoint id that no entry of it
// wants, then the held prefixes if no isolation is to turn off any more,
// with o.mu held.
func (o *order) releaseLocked(id uint16) error {
	if err := o.releaseKeysLocked(id); err != nil {
		return err
	}
	return o.releasePrefixesLocked()
}

func (o *order) releaseKeysLocked(id uint16) error {
	held := o.held[id]
	if len(held) == 0 {
		return nil
	}
	wanted := map[policymap.Key]bool{}
	for e := range o.entries.List(o.db.ReadTxn(), policy.EntryByEndpoint.Query(id)) {
		ks, _ := keysOf(e.Key)
		for _, k := range ks {
			wanted[k] = true
		}
	}
	for k := range held {
		if !wanted[k] {
			o.metrics.writing("policy", "delete")
			if err := o.trie.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("endpoint %d: delete %s, an allow held until its enforcement was off: %w", id, k, err)
			} else if err == nil {
				o.metrics.wrote("policy", "delete")
			}
		}
		delete(held, k)
		o.metrics.held.WithLabelValues("allows").Dec()
	}
	delete(o.held, id)
	return nil
}
