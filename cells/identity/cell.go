package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/statefile"
)

// Cell provides the Allocator of security identities and the table
// "identities".
var Cell = cell.Module(
	"identity",
	"Security identities of label sets node-local or through the kvstore",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(NewTable, job.Registry.NewGroup, newRepairs),
	cell.Provide(newAllocator, statedb.RWTable[*Identity].ToTable, apiRoutes, newMetrics),
)

// Config is the identity cell's configuration.
type Config struct {
	// Labels filters the pod labels that make an identity.
	Labels []string
	// IdentityGCInterval is how often an agent collects the cluster
	// identities nobody uses (with the kvstore).
	IdentityGCInterval time.Duration
}

var defaultConfig = Config{Labels: defaultLabelFilter, IdentityGCInterval: 15 * time.Minute}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.StringSlice("labels", def.Labels,
		"Which pod labels make a pod's identity: label keys or key prefixes ending in *; a leading ! drops what matches; when any pattern has no !, only labels matching one are kept. Replaces the default list")
	flags.Duration("identity-gc-interval", def.IdentityGCInterval,
		"With --kvstore: how often one agent (elected through a kvstore lock) deletes cluster identities that no node has used for two rounds")
}

// Key layout in the kvstore (docs/kvstore.md).
const (
	idPrefix    = "state/identities/v1/id/"
	valuePrefix = "state/identities/v1/value/"
)

// checkpointFile holds the node-local identities in the state dir.
const checkpointFile = "identities.json"

type params struct {
	cell.In

	Config    Config
	Log       *slog.Logger
	DB        *statedb.DB
	Table     statedb.RWTable[*Identity]
	KVStore   kvstore.Client
	Paths     daemon.Paths
	NodeName  daemon.NodeName
	Repairs   *kvsync.Repairs
	Lifecycle cell.Lifecycle
	Jobs      job.Group
	Health    cell.Health
}

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
	node   string
	path   string
	health cell.Health
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
	refs   atomic.Int64
	// stale says the row's Refs lag refs.
	stale atomic.Bool
}

func newUsedIdentity(id identity.NumericIdentity, ls labels.Labels, kind Kind, refs int64) *usedIdentity {
	u := &usedIdentity{id: id, labels: ls, kind: kind}
	u.refs.Store(refs)
	return u
}

// row is u's row of the table now.
func (u *usedIdentity) row() *Identity {
	return &Identity{ID: u.id, Labels: u.labels, Kind: u.kind, Refs: int(u.refs.Load())}
}

func newAllocator(p params) (*Allocator, error) {
	filter, err := parseLabelFilter(p.Config.Labels)
	if err != nil {
		return nil, err
	}
	if p.Config.IdentityGCInterval < time.Second {
		return nil, fmt.Errorf("invalid --identity-gc-interval %s: want 1s or more", p.Config.IdentityGCInterval)
	}
	a := &Allocator{
		log: p.Log, db: p.DB, tbl: p.Table, filter: filter, kv: p.KVStore,
		node: string(p.NodeName), path: filepath.Join(p.Paths.StateDir, checkpointFile), health: p.Health, repairs: p.Repairs,
		used: map[string]*usedIdentity{}, refsChanged: make(chan struct{}, 1),
		writeBacks: writeBacks{pending: map[identity.NumericIdentity]*usedIdentity{}, wake: make(chan struct{}, 1)},
	}
	p.Lifecycle.Append(cell.Hook{OnStart: a.start})
	p.Jobs.Add(job.OneShot("identity-refs", a.publishRefs))
	if a.kv.Enabled() {
		txn := p.DB.WriteTxn(p.Table)
		listed := p.Table.RegisterInitializer(txn, "kvstore-identities")
		txn.Commit()
		p.Jobs.Add(
			job.OneShot("watch-identities", func(ctx context.Context, h cell.Health) error {
				return a.watch(ctx, h, listed)
			}),
			job.OneShot("identity-write-back", a.runWriteBacks),
			job.Timer("identity-gc", a.gcRound, p.Config.IdentityGCInterval),
		)
	}
	return a, nil
}

// start writes the reserved identities and, without the kvstore, loads the
// checkpoint of the local ones.
func (a *Allocator) start(cell.HookContext) error {
	txn := a.db.WriteTxn(a.tbl)
	defer txn.Abort()
	for _, row := range reservedRows() {
		if _, _, err := a.tbl.Insert(txn, row); err != nil {
			return err
		}
	}
	if !a.kv.Enabled() {
		restored, err := a.loadCheckpoint()
		if err != nil {
			return err
		}
		for _, id := range restored {
			a.used[id.Labels.String()] = newUsedIdentity(id.ID, id.Labels, id.Kind, 0)
		}
		if len(restored) > 0 {
			a.log.Info("Restored node-local identities", "identities", len(restored), "file", a.path)
		}
		a.health.OK(fmt.Sprintf("Node-local identities (no kvstore), %d restored", len(restored)))
	}
	txn.Commit()
	return nil
}

type checkpoint struct {
	Version    int `json:"version"`
	Identities []struct {
		ID     identity.NumericIdentity `json:"id"`
		Labels string                   `json:"labels"`
	} `json:"identities"`
}

// loadCheckpoint reads the local identities; a file that cannot be used is
// moved aside (its endpoints get new identities) rather than stop the agent.
func (a *Allocator) loadCheckpoint() ([]*Identity, error) {
	// Not os.ReadFile: a FIFO there would block the start for ever.
	b, err := statefile.ReadRegular(a.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var cp checkpoint
	if err == nil {
		err = json.Unmarshal(b, &cp)
	}
	var out []*Identity
	if err == nil && cp.Version != 1 {
		err = fmt.Errorf("unknown version %d, want 1", cp.Version)
	}
	for _, e := range cp.Identities {
		if err != nil {
			break
		}
		var ls labels.Labels
		ls, err = labels.Parse(e.Labels)
		if err == nil && !e.ID.IsLocal() {
			err = fmt.Errorf("identity %d is outside the local range", e.ID)
		}
		out = append(out, &Identity{ID: e.ID, Labels: ls, Kind: KindLocal})
	}
	if err != nil {
		to, merr := statefile.MoveAside(a.path, filepath.Join(filepath.Dir(a.path), "invalid"))
		if merr != nil {
			return nil, fmt.Errorf("identity checkpoint %s: %w; moving it aside: %w", a.path, err, merr)
		}
		a.log.Error("Invalid identity checkpoint moved aside; restored endpoints get new identities", "file", a.path, "moved-to", to, "error", err)
		// Shown in agent status until the agent restarts.
		a.health.NewScope("checkpoint").Degraded("Identity checkpoint moved aside; restored endpoints get new identities",
			fmt.Errorf("%s moved to %s: %w", a.path, to, err))
		return nil, nil
	}
	return out, nil
}

// writeCheckpoint writes every local identity in use or restored, with
// a.mu held.
func (a *Allocator) writeCheckpoint() error {
	cp := checkpoint{Version: 1}
	for _, u := range a.used {
		if u.kind == KindLocal {
			cp.Identities = append(cp.Identities, struct {
				ID     identity.NumericIdentity `json:"id"`
				Labels string                   `json:"labels"`
			}{u.id, u.labels.String()})
		}
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	if err := statefile.Write(a.path, b); err != nil {
		return fmt.Errorf("write identity checkpoint %s: %w", a.path, err)
	}
	return nil
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
	if !a.kv.Enabled() {
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
	n, err := a.allocateCluster(ctx, key)
	if err != nil {
		return 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := newUsedIdentity(n, ls, KindCluster, 1)
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

// allocateLocal gives a new label set the lowest free node-local number,
// checkpointed before it is handed out.
func (a *Allocator) allocateLocal(ls labels.Labels) (identity.NumericIdentity, error) {
	key := ls.String()
	a.mu.Lock()
	defer a.mu.Unlock()
	if u := a.used[key]; u != nil {
		u.refs.Add(1)
		a.publish(u)
		return u.id, nil
	}
	u := newUsedIdentity(a.freeLocal(), ls, KindLocal, 1)
	a.used[key] = u
	if err := a.writeCheckpoint(); err != nil {
		delete(a.used, key)
		return 0, err
	}
	a.publish(u)
	a.log.Info("Allocated a node-local identity", "identity", u.id, "labels", key)
	return u.id, nil
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

// RestoreDone forgets the restored local identities that no restored
// endpoint took back.
func (a *Allocator) RestoreDone() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	dropped := 0
	for key, u := range a.used {
		if u.refs.Load() == 0 {
			delete(a.used, key)
			dropped++
		}
	}
	if dropped == 0 {
		return nil
	}
	return a.writeCheckpoint()
}

// freeLocal is the lowest local identity not in use, with a.mu held.
func (a *Allocator) freeLocal() identity.NumericIdentity {
	taken := make(map[identity.NumericIdentity]bool, len(a.used))
	for _, u := range a.used {
		taken[u.id] = true
	}
	for n := identity.MinLocal; ; n++ {
		if !taken[n] {
			return n
		}
	}
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
			cand := a.freeCluster()
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

// freeCluster is a random cluster number the table does not know.
func (a *Allocator) freeCluster() identity.NumericIdentity {
	txn := a.db.ReadTxn()
	for {
		cand := identity.MinCluster + identity.NumericIdentity(rand.IntN(int(identity.MaxCluster-identity.MinCluster+1)))
		if _, _, taken := a.tbl.Get(txn, ByID.Query(cand)); !taken {
			return cand
		}
	}
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
	row := &Identity{ID: ch.Value.id, Labels: ch.Value.labels, Kind: KindCluster}
	if u := a.used[row.Labels.String()]; u != nil && u.id == row.ID {
		row.Refs = int(u.refs.Load())
	}
	a.tbl.Insert(txn, row)
	return nil
}
