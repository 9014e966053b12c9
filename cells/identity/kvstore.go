package identity

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// Key layout in the kvstore (docs/kvstore.md).
const (
	idPrefix    = "state/identities/v1/id/"
	valuePrefix = "state/identities/v1/value/"
)

// maxAllocateAttempts bounds the transactions of one allocation: each
// failed one means another node changed the label set's keys meanwhile, or
// a random number was taken.
const maxAllocateAttempts = 64

func (a *Allocator) valueKey(labels string) string { return valuePrefix + labels + "/" + a.node }

// allocateCluster is the cluster-wide number of the label set key, with
// this node's value key for it written. Each step is one compare-and-swap
// transaction, which keeps the invariant "every value key of a label set
// names one number, whose master key names the set" without a lock:
//
//   - a new number's master key is created only together with the set's
//     first value key, and only while the set has none;
//   - a node joins a number only while its master key names the set and
//     every value key of the set (if any) names that number;
//   - the collector deletes a master key only while its set has no value
//     key (gcRound).
//
// A label set the table knows costs one round trip, a new one usually
// one. A node whose table missed an unused master key may create a second
// number for the set; the unused one is collected.
func (a *Allocator) allocateCluster(ctx context.Context, key string) (identity.NumericIdentity, error) {
	values := valuePrefix + key + "/"
	n, _ := a.lookupCluster(key)
	for attempt := 0; attempt < maxAllocateAttempts; attempt++ {
		if n != 0 {
			i, err := a.joinOrRecreate(ctx, n, key)
			if err != nil || i >= 0 {
				return n, err
			}
		} else {
			cand, err := a.freeCluster()
			if err != nil {
				return 0, fmt.Errorf("no cluster identity for %s: %w", key, err)
			}
			i, err := a.kv.Txn(ctx, kvstore.Branch{
				If: []kvstore.Cond{kvstore.Absent(idPrefix + cand.String()), kvstore.NoneUnder(values)},
				Then: []kvstore.Op{kvstore.Put(idPrefix+cand.String(), []byte(key)),
					kvstore.Put(a.valueKey(key), []byte(cand.String()), kvstore.Leased())},
			})
			if err != nil {
				return 0, err
			}
			if i >= 0 {
				a.log.Info("Allocated a cluster identity", "identity", cand, "labels", key)
				return cand, nil
			}
		}
		// The set's keys changed, or the number was taken: what etcd says.
		var err error
		if n, err = a.existing(ctx, key); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("no cluster identity for %s after %d attempts: the label set's keys or the numbers keep changing", key, maxAllocateAttempts)
}

// joinOrRecreate writes this node's value key for the label set key,
// naming n, if n's master key names the set and every value key of the
// set names n. When n's master key is gone (etcd lost it, or someone
// deleted every key) and the set's value keys, if any, all name n, it
// writes the master key again with the value key: a number in use keeps
// its label set, it is not allocated anew. It returns the branch that
// applied (2 and 3: the master key recreated), -1 for none.
func (a *Allocator) joinOrRecreate(ctx context.Context, n identity.NumericIdentity, key string) (int, error) {
	values, master, number := valuePrefix+key+"/", idPrefix+n.String(), []byte(n.String())
	put := kvstore.Put(a.valueKey(key), number, kvstore.Leased())
	recreate := []kvstore.Op{kvstore.Put(master, []byte(key)), put}
	names, gone := kvstore.ValueIs(master, []byte(key)), kvstore.Absent(master)
	i, err := a.kv.Txn(ctx,
		kvstore.Branch{If: []kvstore.Cond{names, kvstore.NoneUnder(values)}, Then: []kvstore.Op{put}},
		kvstore.Branch{If: []kvstore.Cond{names, kvstore.EveryValueUnder(values, number)}, Then: []kvstore.Op{put}},
		kvstore.Branch{If: []kvstore.Cond{gone, kvstore.NoneUnder(values)}, Then: recreate},
		kvstore.Branch{If: []kvstore.Cond{gone, kvstore.EveryValueUnder(values, number)}, Then: recreate})
	if err == nil && i >= 2 {
		a.repairs.Inc()
		a.log.Warn("Wrote back the master key of an identity, which was gone, with the number its label set has", "key", master, "labels", key)
	}
	return i, err
}

// ErrIdentitiesExhausted: every cluster identity number is known.
var ErrIdentitiesExhausted = errors.New("identities exhausted")

// freeClusterTries is how many random numbers freeCluster tries before it
// looks at every number in turn.
const freeClusterTries = 64

// freeCluster is a random cluster number the table does not know: random
// tries, then, with the range nearly full, the next unknown number after a
// random one; ErrIdentitiesExhausted when the table knows every number.
func (a *Allocator) freeCluster() (identity.NumericIdentity, error) {
	txn := a.db.ReadTxn()
	const size = int(identity.MaxCluster - identity.MinCluster + 1)
	free := func(i int) (identity.NumericIdentity, bool) {
		cand := identity.MinCluster + identity.NumericIdentity(i%size)
		_, _, taken := a.tbl.Get(txn, ByID.Query(cand))
		return cand, !taken
	}
	for range freeClusterTries {
		if cand, ok := free(rand.IntN(size)); ok {
			return cand, nil
		}
	}
	start := rand.IntN(size)
	for i := range size {
		if cand, ok := free(start + i); ok {
			return cand, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d cluster identity numbers (%d-%d) are in use: collect unused ones (identity-gc) or use fewer label sets (--labels)",
		ErrIdentitiesExhausted, size, identity.MinCluster, identity.MaxCluster)
}

// lookupCluster is the cluster number the table knows for the label set
// key. With two (two nodes raced a collector, see existing), it is the
// lowest, so every node picks the same.
func (a *Allocator) lookupCluster(key string) (identity.NumericIdentity, bool) {
	for id := range a.tbl.List(a.db.ReadTxn(), ByLabels.Query(key)) {
		if id.Kind == KindCluster {
			return id.ID, true
		}
	}
	return 0, false
}

// existing is the number the value keys of the label set key name (any
// node's, this one's from before a restart included), when its master key
// still names the set or is gone (joinOrRecreate writes it again); 0 for
// none.
func (a *Allocator) existing(ctx context.Context, key string) (identity.NumericIdentity, error) {
	values, err := a.kv.List(ctx, valuePrefix+key+"/")
	if err != nil {
		return 0, err
	}
	for _, v := range values {
		n, err := identity.Parse(string(v.Value))
		if err != nil || !n.IsCluster() {
			a.log.Warn("Ignoring an identity value key that is not a cluster identity", "key", v.Key, "value", string(v.Value))
			continue
		}
		master, found, err := a.kv.Get(ctx, idPrefix+n.String())
		if err != nil {
			return 0, err
		}
		if !found || string(master) == key {
			return n, nil
		}
	}
	return 0, nil
}

// masterKey is an identities/v1/id key as the follower hands it on.
type masterKey struct {
	id     identity.NumericIdentity
	labels labels.Labels
}

// maxMasterValue bounds a master key's value, a label set: a pod's labels
// and its namespace's, which Kubernetes bounds to 256 KiB each in all.
const maxMasterValue = 512 << 10

// parseMasterKey reads a master key: its number in canonical form and in
// the cluster range, its value a label set in canonical form.
func parseMasterKey(key string, value []byte) (masterKey, error) {
	name := strings.TrimPrefix(key, idPrefix)
	n, err := strconv.ParseUint(name, 10, 32)
	id := identity.NumericIdentity(n)
	switch {
	case err != nil || id.String() != name:
		return masterKey{}, fmt.Errorf("not an identity number in canonical form")
	case !id.IsCluster():
		return masterKey{}, fmt.Errorf("identity %d is outside the cluster range %d-%d", id, identity.MinCluster, identity.MaxCluster)
	}
	ls, err := labels.Parse(string(value))
	switch {
	case err != nil:
		return masterKey{}, fmt.Errorf("value %.80q is not a label set: %w", value, err)
	case len(ls) == 0:
		return masterKey{}, fmt.Errorf("empty label set")
	case ls.String() != string(value):
		return masterKey{}, fmt.Errorf("label set %.80q not in canonical form (%.80q)", value, ls.String())
	}
	return masterKey{id, ls}, nil
}

// watch keeps the table's cluster identities equal to the accepted master
// keys. A master key of an identity this node uses that goes, or turns
// bad, is written back with this node's value key.
func (a *Allocator) watch(ctx context.Context, health cell.Health, listed func(statedb.WriteTxn)) error {
	rule := kvsync.Rule[masterKey]{Prefix: idPrefix, MaxValue: maxMasterValue, What: "identity master key", Parse: parseMasterKey}
	return kvsync.Follow(ctx, a.kv, a.log, health, rule, nil, func(changes []kvsync.Change[masterKey], done bool) {
		var writeBack []*usedIdentity
		a.mu.Lock()
		txn := a.db.WriteTxn(a.tbl)
		for _, ch := range changes {
			if u := a.apply(txn, ch); u != nil {
				writeBack = append(writeBack, u)
			}
		}
		if done && listed != nil {
			listed(txn)
			listed = nil
			a.setBackendState(stateWatching)
		}
		txn.Commit()
		a.mu.Unlock()
		if len(writeBack) > 0 {
			a.writeBacks.add(writeBack)
		}
	})
}

// writeBacks are the identities in use whose master key must be written
// back; the job identity-write-back writes them, again a second later for
// those that failed (etcd replaced, and this node's lease not yet in the
// new store, say).
type writeBacks struct {
	mu      sync.Mutex
	pending map[identity.NumericIdentity]*usedIdentity
	wake    chan struct{}
}

func (w *writeBacks) add(us []*usedIdentity) {
	w.mu.Lock()
	for _, u := range us {
		w.pending[u.id] = u
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (a *Allocator) runWriteBacks(ctx context.Context, health cell.Health) error {
	w := &a.writeBacks
	for {
		var retry <-chan time.Time
		w.mu.Lock()
		pending := w.pending
		w.pending = map[identity.NumericIdentity]*usedIdentity{}
		w.mu.Unlock()
		var failed []*usedIdentity
		var err error
		for _, u := range pending {
			if e := a.writeBack(ctx, u); e != nil {
				failed, err = append(failed, u), e
			}
		}
		if len(failed) > 0 {
			w.mu.Lock()
			for _, u := range failed {
				if _, newer := w.pending[u.id]; !newer {
					w.pending[u.id] = u
				}
			}
			w.mu.Unlock()
			health.Degraded(fmt.Sprintf("Writing back %d master keys of identities in use", len(failed)), err)
			retry = time.After(time.Second)
		} else if len(pending) > 0 {
			health.OK("Master keys of identities in use written back")
		}
		select {
		case <-w.wake:
		case <-retry:
		case <-ctx.Done():
			return nil
		}
	}
}

// writeBack writes again the master key of an identity this node uses,
// which someone deleted or changed, with this node's value key (which
// went too when every key was deleted at once): its endpoints keep their
// number, the number keeps naming their label set, and the collector
// sees it in use. A master key that now names a label set in use
// elsewhere is left alone, and logged.
func (a *Allocator) writeBack(ctx context.Context, u *usedIdentity) error {
	ls := u.labels.String()
	unlock := a.sets.lock(ls)
	defer unlock()
	if a.mode == ModeCRD {
		return a.writeBackCRD(ctx, u)
	}
	a.mu.RLock()
	still := a.used[ls] == u && u.refs.Load() > 0
	a.mu.RUnlock()
	if !still {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	master := idPrefix + u.id.String()
	put := kvstore.Put(a.valueKey(ls), []byte(u.id.String()), kvstore.Leased())
	rewrite := []kvstore.Op{kvstore.Put(master, []byte(ls)), put}
	branches := []kvstore.Branch{
		{If: []kvstore.Cond{kvstore.Absent(master)}, Then: rewrite},
		{If: []kvstore.Cond{kvstore.ValueIs(master, []byte(ls))}, Then: []kvstore.Op{put}},
	}
	cur, found, err := a.kv.Get(ctx, master)
	if err == nil && found && string(cur) != ls {
		// Changed by hand: put right unless its value is a label set that
		// some node uses with this number.
		branches = append(branches, kvstore.Branch{
			If:   []kvstore.Cond{kvstore.ValueIs(master, cur), kvstore.NoneUnder(valuePrefix + string(cur) + "/")},
			Then: rewrite,
		})
	}
	i := -1
	if err == nil {
		i, err = a.kv.Txn(ctx, branches...)
	}
	switch {
	case err != nil:
		a.log.Warn("An identity in use lost its master key and writing it back failed; retrying", "key", master, "labels", ls, "error", err)
		return err
	case i < 0:
		a.log.Error("An identity in use lost its master key to a label set in use elsewhere; its endpoints need new identities", "key", master, "labels", ls, "now", string(cur))
	default:
		a.repairs.Inc()
		a.log.Warn("Wrote back the master key of an identity in use, and this node's value key", "key", master, "labels", ls, "value-key", a.valueKey(ls))
	}
	return nil
}

// apply writes a master key's change into the table, with a.mu held. It
// returns the identity this node uses whose master key went, turned bad or
// names another label set, for the watcher to write back; its row stays.
func (a *Allocator) apply(txn statedb.WriteTxn, ch kvsync.Change[masterKey]) (writeBack *usedIdentity) {
	if ch.Deleted {
		n, _ := strconv.ParseUint(strings.TrimPrefix(ch.Key, idPrefix), 10, 32)
		id := identity.NumericIdentity(n)
		if u := a.usedByID(id); u != nil && u.kind == KindCluster {
			return u
		}
		if old, _, found := a.tbl.Get(txn, ByID.Query(id)); found {
			a.tbl.Delete(txn, old)
		}
		return nil
	}
	if u := a.usedByID(ch.Value.id); u != nil && u.kind == KindCluster && !u.labels.Equal(ch.Value.labels) {
		// Rewritten to name another label set: this node's endpoints hold
		// the number for theirs.
		return u
	}
	row := &Identity{ID: ch.Value.id, Labels: ch.Value.labels, Kind: KindCluster, Source: SourceKVStore}
	if u := a.used[row.Labels.String()]; u != nil && u.id == row.ID {
		row.Refs = int(u.refs.Load())
	}
	a.tbl.Insert(txn, row)
	return nil
}
