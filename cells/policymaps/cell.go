package policymaps

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/internal/faultpoint"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/policymap"
)

// Cell declares the policy maps and reconciles the policy tables into them.
var Cell = cell.Module(
	"policy-maps",
	"BPF network policy maps reconciled from the policy tables",

	cell.Config(defaultConfig),
	cell.ProvidePrivate(job.Registry.NewGroup),
	cell.Provide(newMaps, newMetrics, newVerdictCounter),
	cell.Invoke(registerReconcilers, registerVerdictCounter),
)

// Config is the policy-maps cell's configuration.
type Config struct {
	PolicyMapMax uint32
	// PolicyMapTestCrashAfter, a hidden flag for crash tests, kills the
	// agent with SIGKILL right after its Nth policy map write: in the
	// middle of reconciling a change.
	PolicyMapTestCrashAfter uint32
}

// The default holds 64 allows (or blocks of a port range) for each of a
// node's 1,024 endpoints; the trie is not preallocated, so an entry costs
// kernel memory only once written.
var defaultConfig = Config{PolicyMapMax: 1 << 16}

func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Uint32("policy-map-max", def.PolicyMapMax,
		"Entries of the policy map that all endpoints of the node share (one per allow, or per prefix-aligned block of an allow's port range)")
	flags.Uint32("policy-map-test-crash-after", def.PolicyMapTestCrashAfter,
		"TEST ONLY: kill the agent with SIGKILL right after its Nth write or delete of a policy map since it started (0: never)")
	flags.MarkHidden("policy-map-test-crash-after")
}

// Maps are the pinned policy maps.
type Maps struct {
	Policy      *bpfmaps.Map[policymap.Key, policymap.Value]
	Enforcement *bpfmaps.Map[uint32, policymap.Enforcement]
	Prefixes    *bpfmaps.Map[policymap.PrefixKey, policymap.PrefixValue]
}

func newMaps(cfg Config, lc cell.Lifecycle, reg *bpfmaps.Registry) (*Maps, error) {
	if cfg.PolicyMapMax == 0 {
		return nil, errors.New("invalid --policy-map-max 0: want at least 1 entry")
	}
	p, err := bpfmaps.NewMap[policymap.Key, policymap.Value](lc, reg, bpfmaps.Spec{
		Name: policymap.MapName, Type: ebpf.LPMTrie, MaxEntries: cfg.PolicyMapMax, Flags: unix.BPF_F_NO_PREALLOC,
	})
	if err != nil {
		return nil, err
	}
	e, err := bpfmaps.NewMap[uint32, policymap.Enforcement](lc, reg, bpfmaps.Spec{
		Name: policymap.EnforcementMapName, Type: ebpf.Hash, MaxEntries: policymap.EnforcementMaxEntries,
	})
	if err != nil {
		return nil, err
	}
	pr, err := bpfmaps.NewMap[policymap.PrefixKey, policymap.PrefixValue](lc, reg, bpfmaps.Spec{
		Name: policymap.PrefixMapName, Type: ebpf.LPMTrie, MaxEntries: policymap.PrefixMaxEntries, Flags: unix.BPF_F_NO_PREALLOC,
	})
	if err != nil {
		return nil, err
	}
	return &Maps{Policy: p, Enforcement: e, Prefixes: pr}, nil
}

// EBPF is the maps by name, for the programs' MapReplacements.
func (m *Maps) EBPF() map[string]*ebpf.Map {
	return map[string]*ebpf.Map{m.Policy.Name(): m.Policy.EBPF(), m.Enforcement.Name(): m.Enforcement.EBPF(),
		m.Prefixes.Name(): m.Prefixes.EBPF()}
}

// mapMetrics are the cell's figures, under cellium_policy_map_.
type mapMetrics struct {
	writes  *prometheus.CounterVec
	full    prometheus.Counter
	repairs prometheus.Counter
	held    *prometheus.GaugeVec

	// crash is --policy-map-test-crash-after: it counts the writes of the
	// three reconcilers.
	crash *faultpoint.Count
	// beforeWrite, when a test sets it, is called before each write or
	// delete of the policy maps.
	beforeWrite func(m, op string)
	// waiting, when a test sets it, is called each time an endpoint's
	// isolation goes to wait for its allows and prefixes, with how many
	// of each are Pending.
	waiting func(endpoint uint16, entries, prefixes int)
}

// writing is called before a write or delete of map with op.
func (mm *mapMetrics) writing(m, op string) {
	if mm.beforeWrite != nil {
		mm.beforeWrite(m, op)
	}
}

// wrote counts a write or delete of map with op, and kills the agent when
// --policy-map-test-crash-after says this is the one.
func (mm *mapMetrics) wrote(m, op string) {
	mm.writes.WithLabelValues(m, op).Inc()
	mm.crash.Hit("map", m, "op", op)
}

func newMetrics() (*mapMetrics, metrics.Collectors) {
	const ns, sub = "cellium", "policy_map"
	m := &mapMetrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "writes_total",
			Help: "Updates and deletes of the policy maps, by map (policy, enforcement, prefix) and operation (update, delete)",
		}, []string{"map", "op"}),
		full: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "full_total",
			Help: "Policy entries the full policy map refused (--policy-map-max); their endpoints are failed until written",
		}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "repairs_total",
			Help: "Policy map entries, flags and prefixes written again because they went missing or changed behind the agent's back, or removed because they were added there",
		}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "held",
			Help: "Policy map writes held back for order: enforcement (endpoints whose isolation waits for their allows to be written), allows (keys kept until their endpoint's isolation is off), prefixes (prefixes kept until no endpoint's isolation is to turn off)",
		}, []string{"what"}),
	}
	return m, metrics.NewCollectors(m.writes, m.full, m.repairs, m.held)
}

// refreshInterval is how often every row is checked against the maps
// again, putting back what went missing; a variable for the tests.
var refreshInterval = 10 * time.Minute

// pruneInterval is how often the maps are pruned of what no row wants:
// an allow, flags or a prefix added behind the agent's back (an allow
// there opens an endpoint) goes within a minute, not the reconciler's
// default hour. A prune reads every key of the map; a variable for the
// tests.
var pruneInterval = time.Minute

func registerReconcilers(p reconciler.Params, cfg Config, log *slog.Logger, h cell.Health, m *Maps, mm *mapMetrics,
	entries statedb.RWTable[*policy.Entry], enforcement statedb.RWTable[*policy.Enforcement],
	prefixes statedb.RWTable[*policy.Prefix]) error {
	mm.crash = faultpoint.After(log, cfg.PolicyMapTestCrashAfter, "policy map write")
	ord := &order{db: p.DB, entries: entries, enforcement: enforcement, prefixes: prefixes, enf: m.Enforcement, trie: m.Policy, prefixMap: m.Prefixes,
		metrics: mm, held: map[uint16]map[policymap.Key]bool{}, heldPrefixes: map[netip.Prefix]bool{}}
	eo := &entryOps{cfg: cfg, log: log, health: h, m: m.Policy, metrics: mm, entries: entries, order: ord, failed: map[uint16]*failedEndpoint{}}
	if _, err := reconciler.Register(p, entries,
		(*policy.Entry).Clone,
		func(e *policy.Entry, s reconciler.Status) *policy.Entry { e.Status = s; return e },
		func(e *policy.Entry) reconciler.Status { return e.Status },
		eo, nil, reconciler.WithName("entries"),
		reconciler.WithRefreshing(refreshInterval, rate.NewLimiter(1000, 100)),
		reconciler.WithPruning(pruneInterval),
	); err != nil {
		return err
	}
	fo := &enforcementOps{log: log, m: m.Enforcement, metrics: mm, order: ord}
	if _, err := reconciler.Register(p, enforcement,
		(*policy.Enforcement).Clone,
		func(e *policy.Enforcement, s reconciler.Status) *policy.Enforcement { e.Status = s; return e },
		func(e *policy.Enforcement) reconciler.Status { return e.Status },
		fo, nil, reconciler.WithName("enforcement"),
		reconciler.WithRefreshing(refreshInterval, rate.NewLimiter(1000, 100)),
		reconciler.WithPruning(pruneInterval),
	); err != nil {
		return err
	}
	po := &prefixOps{log: log, health: h, m: m.Prefixes, metrics: mm, order: ord, prefixes: prefixes, entries: entries, enforcement: enforcement,
		failed: map[netip.Prefix]error{}, withheld: map[netip.Prefix]*policy.Prefix{}}
	_, err := reconciler.Register(p, prefixes,
		(*policy.Prefix).Clone,
		func(e *policy.Prefix, s reconciler.Status) *policy.Prefix { e.Status = s; return e },
		func(e *policy.Prefix) reconciler.Status { return e.Status },
		po, nil, reconciler.WithName("prefixes"),
		reconciler.WithRefreshing(refreshInterval, rate.NewLimiter(1000, 100)),
		reconciler.WithPruning(pruneInterval),
	)
	return err
}

// allowOf is the map's view of an entry.
func allowOf(k policy.EntryKey) policymap.Allow {
	dir := policymap.Ingress
	if k.Direction == policy.Egress {
		dir = policymap.Egress
	}
	return policymap.Allow{EndpointID: k.EndpointID, Direction: dir, Identity: uint32(k.Identity),
		Proto: k.Protocol, Port: k.Port, EndPort: k.EndPort}
}

func keysOf(k policy.EntryKey) ([]policymap.Key, error) {
	keys, err := policymap.KeysOf(allowOf(k))
	if err != nil {
		return nil, fmt.Errorf("policy entry %s: %w", k, err)
	}
	return keys, nil
}

// strayRemoved counts a key a prune removed as a repair, unless it is the
// first prune (pruned false), which removes what a restart left.
func (m *mapMetrics) strayRemoved(pruned bool) bool {
	if !pruned {
		return false
	}
	m.repairs.Inc()
	return true
}

// failedEndpoint is an endpoint some of whose entries the full map
// refused, with its health scope.
type failedEndpoint struct {
	entries map[policy.EntryKey]bool
	health  cell.Health
}

// entryOps writes policy entries into the trie. The reconciler calls it
// from one goroutine.
type entryOps struct {
	cfg     Config
	log     *slog.Logger
	health  cell.Health
	m       *bpfmaps.Map[policymap.Key, policymap.Value]
	metrics *mapMetrics
	entries statedb.Table[*policy.Entry]
	order   *order
	failed  map[uint16]*failedEndpoint
	pruned  bool
}

// has says whether the trie holds exactly k, and its cookie: a lookup
// finds the longest entry that covers k, which is k itself if its value
// has k's length.
func (o *entryOps) has(k policymap.Key) (bool, uint32, error) {
	v, err := o.m.Lookup(k)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, 0, nil
	}
	return err == nil && v.PrefixLen == k.PrefixLen, v.Cookie, err
}

func (o *entryOps) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e *policy.Entry) error {
	keys, err := keysOf(e.Key)
	if err != nil {
		return err
	}
	cookie := policymap.Cookie(e.Policies)
	refresh := e.Status.Kind == reconciler.StatusKindRefreshing
	for _, k := range keys {
		ok, got, err := o.has(k)
		if err != nil {
			return fmt.Errorf("policy entry %s: look up %s: %w", e.Key, k, err)
		}
		// A key two entries of the endpoint share (overlapping port
		// ranges) holds the cookie of the one written last: a refresh
		// leaves it, as any of them allows the traffic.
		if ok && (got == cookie || refresh) {
			continue
		}
		o.metrics.writing("policy", "update")
		if err := o.m.Put(k, policymap.Value{PrefixLen: k.PrefixLen, Cookie: cookie}); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				o.metrics.full.Inc()
				err = fmt.Errorf("endpoint %d: policy map %s is full (--policy-map-max=%d): entry %s not written: %w",
					e.Key.EndpointID, o.m.Name(), o.cfg.PolicyMapMax, e.Key, err)
				o.fail(e.Key, err)
				return err
			}
			return fmt.Errorf("policy entry %s: write %s: %w", e.Key, k, err)
		}
		o.metrics.wrote("policy", "update")
		if refresh {
			o.metrics.repairs.Inc()
			o.log.Warn("Put back a policy map entry that went missing", "key", k, "entry", e.Key)
		}
	}
	o.recovered(e.Key)
	return nil
}

// fail marks k's endpoint failed.
func (o *entryOps) fail(k policy.EntryKey, err error) {
	f := o.failed[k.EndpointID]
	if f == nil {
		f = &failedEndpoint{entries: map[policy.EntryKey]bool{}, health: o.health.NewScope("endpoint-" + strconv.Itoa(int(k.EndpointID)))}
		o.failed[k.EndpointID] = f
	}
	f.entries[k] = true
	f.health.Degraded(fmt.Sprintf("Endpoint %d: %d policy entries not in the datapath: it denies more than its policy", k.EndpointID, len(f.entries)), err)
}

// recovered clears k from its endpoint's failures, and the endpoint's
// failed state with the last one.
func (o *entryOps) recovered(k policy.EntryKey) {
	f := o.failed[k.EndpointID]
	if f == nil || !f.entries[k] {
		return
	}
	delete(f.entries, k)
	if len(f.entries) == 0 {
		f.health.Close()
		delete(o.failed, k.EndpointID)
		o.log.Info("Every policy entry of the endpoint is in the datapath again", "endpoint", k.EndpointID)
	}
}

func (o *entryOps) Delete(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, e *policy.Entry) error {
	o.recovered(e.Key)
	keys, err := keysOf(e.Key)
	if err != nil {
		// Never written: an entry that KeysOf refuses fails its update.
		return nil
	}
	// The keys of the endpoint's other entries stay, with their cookie.
	keep := map[policymap.Key]uint32{}
	for other := range o.entries.List(txn, policy.EntryByEndpoint.Query(e.Key.EndpointID)) {
		if other.Key == e.Key {
			continue
		}
		ks, _ := keysOf(other.Key)
		for _, k := range ks {
			keep[k] = policymap.Cookie(other.Policies)
		}
	}
	var drop []policymap.Key
	for _, k := range keys {
		if cookie, ok := keep[k]; ok {
			if _, got, err := o.has(k); err == nil && got != cookie {
				o.metrics.writing("policy", "update")
				if err := o.m.Put(k, policymap.Value{PrefixLen: k.PrefixLen, Cookie: cookie}); err != nil {
					return fmt.Errorf("policy entry %s: write %s for another entry: %w", e.Key, k, err)
				}
				o.metrics.wrote("policy", "update")
			}
			continue
		}
		drop = append(drop, k)
	}
	// Break after make: while the endpoint's enforcement is on in this
	// direction and is to be off, its allows stay (see order).
	if held, err := o.order.holdKeys(txn, e.Key.EndpointID, e.Key.Direction, drop); err != nil || held {
		return err
	}
	for _, k := range drop {
		o.metrics.writing("policy", "delete")
		if err := o.m.Delete(k); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return fmt.Errorf("policy entry %s: delete %s: %w", e.Key, k, err)
		}
		o.metrics.wrote("policy", "delete")
	}
	return nil
}

// Prune removes the keys no entry wants, but those whose endpoint's
// isolation is to turn off first (see order.keepPruned).
func (o *entryOps) Prune(_ context.Context, txn statedb.ReadTxn, entries iter.Seq2[*policy.Entry, statedb.Revision]) error {
	// The first prune removes what the tables no longer want after a
	// restart; a later one, what was added behind the agent's back.
	defer func() { o.pruned = true }()
	want := map[policymap.Key]bool{}
	for e := range entries {
		ks, _ := keysOf(e.Key)
		for _, k := range ks {
			want[k] = true
		}
	}
	return o.m.Prune(func(k policymap.Key) bool { return want[k] || o.order.keepPruned(txn, k) }, func(k policymap.Key, err error) error {
		if err != nil {
			return fmt.Errorf("delete stale %s: %w", k, err)
		}
		o.metrics.wrote("policy", "delete")
		if o.metrics.strayRemoved(o.pruned) {
			o.log.Warn("Removed a policy map entry that no policy entry wants, added behind the agent's back", "key", k)
			return nil
		}
		o.log.Info("Removed a policy map entry that no policy entry wants", "key", k)
		return nil
	})
}

// enforcementOps writes the enforcement rows, in order with the allows
// (see order).
type enforcementOps struct {
	log     *slog.Logger
	m       *bpfmaps.Map[uint32, policymap.Enforcement]
	metrics *mapMetrics
	order   *order
	pruned  bool
}

func flagsOf(e *policy.Enforcement) uint8 {
	var f uint8
	if e.Ingress {
		f |= policymap.FlagIngress
	}
	if e.Egress {
		f |= policymap.FlagEgress
	}
	return f
}

func (o *enforcementOps) Update(ctx context.Context, _ statedb.ReadTxn, rev statedb.Revision, e *policy.Enforcement) error {
	want := policymap.Enforcement{Flags: flagsOf(e)}
	got, err := o.m.Lookup(uint32(e.EndpointID))
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		got = policymap.Enforcement{}
	case err != nil:
		return fmt.Errorf("endpoint %d: look up its enforcement: %w", e.EndpointID, err)
	}
	// Make before isolate: a direction turns on once the allows are in.
	if want.Flags&^got.Flags != 0 {
		if current, err := o.order.waitAllows(ctx, e.EndpointID, rev); err != nil || !current {
			return err
		}
	}
	wrote, err := o.order.write(e.EndpointID, rev, want)
	if err != nil {
		return err
	}
	if wrote && e.Status.Kind == reconciler.StatusKindRefreshing {
		o.metrics.repairs.Inc()
		o.log.Warn("Put back an endpoint's policy enforcement that was changed", "endpoint", e.EndpointID,
			"ingress", e.Ingress, "egress", e.Egress)
	}
	return nil
}

func (o *enforcementOps) Delete(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, e *policy.Enforcement) error {
	return o.order.remove(e.EndpointID)
}

func (o *enforcementOps) Prune(_ context.Context, _ statedb.ReadTxn, rows iter.Seq2[*policy.Enforcement, statedb.Revision]) error {
	// The first prune removes what the tables no longer want after a
	// restart; a later one, what was added behind the agent's back.
	defer func() { o.pruned = true }()
	want := map[uint32]bool{}
	for e := range rows {
		want[uint32(e.EndpointID)] = true
	}
	return o.m.Prune(func(id uint32) bool { return want[id] }, func(id uint32, err error) error {
		if err != nil {
			return fmt.Errorf("delete the enforcement of endpoint %d: %w", id, err)
		}
		o.metrics.wrote("enforcement", "delete")
		if o.metrics.strayRemoved(o.pruned) {
			o.log.Warn("Removed the policy enforcement of an endpoint that has none, added behind the agent's back", "endpoint", id)
			return nil
		}
		o.log.Info("Removed the policy enforcement of an endpoint that has none", "endpoint", id)
		return nil
	})
}

// prefixOps writes the ipBlock prefixes and their IDs into the prefix trie.
//
// A prefix in the trie without a more specific one inside it gives that
// one's addresses its own ID: an ipBlock's cidr written while its except
// is not would allow the addresses the except takes out. So a prefix the
// trie refuses (full) is failed, and every prefix of the table that
// contains it is kept out of the trie (withheld: removed if it was in)
// until no failed prefix is inside it: the datapath then denies more than
// the policies, never more is allowed. The engine writes longer prefixes
// first (policy.prefixCache.flush), so that a trie filling up refuses
// cidrs before their excepts. Health (scope "prefixes") names the
// prefixes and the policies whose allows they carry.
type prefixOps struct {
	log         *slog.Logger
	health      cell.Health
	m           *bpfmaps.Map[policymap.PrefixKey, policymap.PrefixValue]
	metrics     *mapMetrics
	order       *order
	prefixes    statedb.Table[*policy.Prefix]
	entries     statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]

	// failed are the prefixes the trie refused, with the error;
	// withheld the rows taken out of the trie (reconciled before) because
	// a failed prefix is inside them. scope is the health of both.
	failed   map[netip.Prefix]error
	withheld map[netip.Prefix]*policy.Prefix
	scope    cell.Health
	pruned   bool
}

// failedInside is a failed prefix strictly inside p, if any.
func (o *prefixOps) failedInside(p netip.Prefix) (netip.Prefix, error, bool) {
	for f, err := range o.failed {
		if f.Bits() > p.Bits() && f.Addr().Is4() == p.Addr().Is4() && p.Contains(f.Addr()) {
			return f, err, true
		}
	}
	return netip.Prefix{}, nil, false
}

// remove deletes p's own key from the trie (no error if it is not there).
func (o *prefixOps) remove(p netip.Prefix) error {
	o.metrics.writing("prefix", "delete")
	if err := o.m.Delete(policymap.PrefixKeyOf(p)); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("policy prefix %s: remove it: %w", p, err)
	}
	o.metrics.wrote("prefix", "delete")
	return nil
}

func (o *prefixOps) Update(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, p *policy.Prefix) error {
	if inner, innerErr, ok := o.failedInside(p.Prefix); ok {
		delete(o.withheld, p.Prefix)
		if err := o.remove(p.Prefix); err != nil {
			return err
		}
		o.report(txn)
		return fmt.Errorf("policy prefix %s withheld from the trie: %s inside it is not in the trie (%v), and %s alone would give its addresses %s's ID",
			p.Prefix, inner, innerErr, p.Prefix, p.Prefix)
	}
	k, want := policymap.PrefixKeyOf(p.Prefix), policymap.PrefixValue{ID: uint32(p.ID)}
	// A lookup finds the longest prefix that covers k: k's own entry only
	// if it holds k's ID.
	got, err := o.m.Lookup(k)
	switch {
	case err == nil && got == want:
		delete(o.withheld, p.Prefix)
		o.written(txn, p.Prefix)
		return nil
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
		return fmt.Errorf("policy prefix %s: look it up: %w", p.Prefix, err)
	}
	o.metrics.writing("prefix", "update")
	if err := o.m.Put(k, want); err != nil {
		err = o.putError(p.Prefix, err)
		o.failed[p.Prefix] = err
		if werr := o.withhold(txn, p.Prefix); werr != nil {
			return errors.Join(err, werr)
		}
		o.report(txn)
		return err
	}
	o.metrics.wrote("prefix", "update")
	if p.Status.Kind == reconciler.StatusKindRefreshing {
		o.metrics.repairs.Inc()
		o.log.Warn("Put back a policy prefix that went missing", "prefix", p.Prefix, "id", p.ID)
	}
	delete(o.withheld, p.Prefix)
	o.written(txn, p.Prefix)
	return nil
}

// putError is the error of p's write into the trie.
func (o *prefixOps) putError(p netip.Prefix, err error) error {
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("policy prefix %s not written: the prefix trie %s is full (%d prefixes): %w", p, o.m.Name(), policymap.PrefixMaxEntries, unix.ENOSPC)
	}
	return fmt.Errorf("policy prefix %s: write it: %w", p, err)
}

// withhold takes out of the trie every prefix of the table that contains
// the failed prefix f.
func (o *prefixOps) withhold(txn statedb.ReadTxn, f netip.Prefix) error {
	for bits := f.Bits() - 1; bits >= 0; bits-- {
		q := netip.PrefixFrom(f.Addr(), bits).Masked()
		row, _, found := o.prefixes.Get(txn, policy.PrefixByPrefix.Query(q))
		if !found {
			continue
		}
		if err := o.remove(q); err != nil {
			return err
		}
		// Whatever its status says (the reconciler writes the statuses
		// of a round after it): a row not yet tried is refused by its
		// Update, which drops it from withheld.
		if _, ok := o.withheld[q]; !ok {
			o.log.Warn("Withheld a policy prefix from the trie: a more specific prefix inside it is not in the trie",
				"prefix", q, "inside", f)
		}
		o.withheld[q] = row
	}
	return nil
}

// written: p is in the trie (or gone from the table). If it was failed,
// the prefixes withheld for it go back in.
func (o *prefixOps) written(txn statedb.ReadTxn, p netip.Prefix) {
	if _, ok := o.failed[p]; !ok {
		return
	}
	delete(o.failed, p)
	o.putBack(txn)
}

// putBack writes the withheld prefixes with no failed prefix inside them,
// longer ones first. One the trie refuses (full: another prefix took the
// room) stays withheld and counts as failed, so that the prefixes
// containing it are withheld too; it is tried again when a prefix is
// deleted or a failed one written.
func (o *prefixOps) putBack(txn statedb.ReadTxn) {
	defer o.report(txn)
	withheld := slices.SortedFunc(maps.Keys(o.withheld), func(a, b netip.Prefix) int { return b.Bits() - a.Bits() })
	for _, q := range withheld {
		row, ok := o.withheld[q]
		if !ok {
			continue
		}
		if _, _, ok := o.failedInside(q); ok {
			continue
		}
		o.metrics.writing("prefix", "update")
		if err := o.m.Put(policymap.PrefixKeyOf(q), policymap.PrefixValue{ID: uint32(row.ID)}); err != nil {
			o.failed[q] = o.putError(q, err)
			if err := o.withhold(txn, q); err != nil {
				o.log.Warn("Could not withhold the policy prefixes containing one not in the trie", "prefix", q, "error", err)
			}
			continue
		}
		o.metrics.wrote("prefix", "update")
		delete(o.withheld, q)
		delete(o.failed, q)
		o.log.Info("Put back a withheld policy prefix: every prefix inside it is in the trie", "prefix", q)
	}
}

// report puts the failed and withheld prefixes, and the policies whose
// allows they carry, in health.
func (o *prefixOps) report(txn statedb.ReadTxn) {
	if len(o.failed) == 0 && len(o.withheld) == 0 {
		if o.scope != nil {
			o.scope.Close()
			o.scope = nil
			o.log.Info("Every policy prefix is in the trie again")
		}
		return
	}
	ids := map[identity.NumericIdentity]bool{}
	var errs []error
	for f, err := range o.failed {
		// f and the prefixes containing it, refused or withheld for it.
		for bits := f.Bits(); bits >= 0; bits-- {
			if row, _, ok := o.prefixes.Get(txn, policy.PrefixByPrefix.Query(netip.PrefixFrom(f.Addr(), bits).Masked())); ok {
				ids[row.ID] = true
			}
		}
		errs = append(errs, err)
	}
	var held []string
	for q, row := range o.withheld {
		ids[row.ID] = true
		held = append(held, q.String())
	}
	slices.Sort(held)
	names := map[string]bool{}
	for enf := range o.enforcement.All(txn) {
		for id := range ids {
			for e := range o.entries.List(txn, policy.EntryByEndpointIdentity.Query(policy.EndpointIdentity{EndpointID: enf.EndpointID, Identity: id})) {
				for _, n := range e.Policies {
					names[n] = true
				}
			}
		}
	}
	msg := fmt.Sprintf("%d ipBlock prefixes not in the trie, %d withheld (%s): NetworkPolicies %s deny more than written",
		len(o.failed), len(o.withheld), strings.Join(held, ","), strings.Join(slices.Sorted(maps.Keys(names)), ","))
	if o.scope == nil {
		o.scope = o.health.NewScope("prefixes")
	}
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
	}
	o.scope.Degraded(msg, errors.Join(errs...))
}

func (o *prefixOps) Delete(_ context.Context, txn statedb.ReadTxn, _ statedb.Revision, p *policy.Prefix) error {
	_, wasWithheld := o.withheld[p.Prefix]
	_, wasFailed := o.failed[p.Prefix]
	if wasFailed {
		// Never in the trie: nothing to hold back, and the prefixes
		// withheld for it alone can go in.
		delete(o.withheld, p.Prefix)
		delete(o.failed, p.Prefix)
		o.putBack(txn)
		return nil
	}
	// Break after open: while an isolation is to turn off, the allows it
	// holds may match through p (see order).
	if held, err := o.order.holdPrefix(txn, p.Prefix); err != nil || held {
		return err
	}
	delete(o.withheld, p.Prefix)
	if err := o.remove(p.Prefix); err != nil {
		return err
	}
	// Room in the trie: what is withheld may fit now.
	if wasWithheld || len(o.withheld) > 0 {
		o.putBack(txn)
	}
	return nil
}

func (o *prefixOps) Prune(_ context.Context, txn statedb.ReadTxn, rows iter.Seq2[*policy.Prefix, statedb.Revision]) error {
	// The first prune removes what the tables no longer want after a
	// restart; a later one, what was added behind the agent's back.
	defer func() { o.pruned = true }()
	want := map[policymap.PrefixKey]bool{}
	for p := range rows {
		want[policymap.PrefixKeyOf(p.Prefix)] = true
	}
	keep := func(k policymap.PrefixKey) bool {
		if want[k] {
			return true
		}
		held, err := o.order.holdPrefix(txn, k.Prefix())
		return held || err != nil
	}
	return o.m.Prune(keep, func(k policymap.PrefixKey, err error) error {
		if err != nil {
			return fmt.Errorf("delete stale policy prefix %s: %w", k.Prefix(), err)
		}
		o.metrics.wrote("prefix", "delete")
		if o.metrics.strayRemoved(o.pruned) {
			o.log.Warn("Removed a policy prefix that no policy names, added behind the agent's back", "prefix", k.Prefix())
			return nil
		}
		o.log.Info("Removed a policy prefix that no policy names", "prefix", k.Prefix())
		return nil
	})
}
