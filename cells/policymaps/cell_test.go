package policymaps

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/policymap"
)

// pruneSignal is the reconcilers' metrics: it tells the test when a prune
// has run.
type pruneSignal struct {
	reconciler.Metrics
	pruned chan string
	// ops, when a test sets it before the start, gets "name op" after
	// each reconciliation of a row.
	ops chan string
}

func (p *pruneSignal) ReconciliationDuration(id cell.FullModuleID, name, op string, d time.Duration) {
	p.Metrics.ReconciliationDuration(id, name, op, d)
	if p.ops != nil {
		select {
		case p.ops <- name + " " + op:
		default:
		}
	}
}

func (p *pruneSignal) PruneDuration(id cell.FullModuleID, name string, d time.Duration) {
	p.Metrics.PruneDuration(id, name, d)
	select {
	case p.pruned <- name:
	default:
	}
}

// agent is one run of policy-maps over tables the test fills, playing the
// policy cell; done completes the tables' initializers.
type agent struct {
	h           *hive.Hive
	db          *statedb.DB
	entries     statedb.RWTable[*policy.Entry]
	enforcement statedb.RWTable[*policy.Enforcement]
	prefixes    statedb.RWTable[*policy.Prefix]
	health      statedb.Table[*health.Status]
	maps        *Maps
	metrics     *mapMetrics
	done        func()
	signal      *pruneSignal
}

func newAgent(t testing.TB, root string, max uint32) *agent {
	a := &agent{signal: &pruneSignal{Metrics: reconciler.NewUnpublishedExpVarMetrics(), pruned: make(chan string, 16)}}
	a.h = celltest.New(bpfmaps.Cell, Cell,
		cell.Module("test-policy", "Policy tables filled by the test",
			cell.Provide(policy.NewEntriesTable, policy.NewEnforcementTable, policy.NewPrefixesTable, func() reconciler.Metrics { return a.signal }),
			cell.Invoke(func(db *statedb.DB, e statedb.RWTable[*policy.Entry], f statedb.RWTable[*policy.Enforcement],
				pr statedb.RWTable[*policy.Prefix], hs statedb.Table[*health.Status], m *Maps, mm *mapMetrics) {
				a.db, a.entries, a.enforcement, a.prefixes, a.health, a.maps, a.metrics = db, e, f, pr, hs, m, mm
				txn := db.WriteTxn(e, f, pr)
				doneE := e.RegisterInitializer(txn, "policy-compute")
				doneF := f.RegisterInitializer(txn, "policy-compute")
				doneP := pr.RegisterInitializer(txn, "policy-compute")
				txn.Commit()
				a.done = func() {
					txn := db.WriteTxn(e, f, pr)
					doneE(txn)
					doneF(txn)
					doneP(txn)
					txn.Commit()
				}
			}),
		),
	)
	hive.AddConfigOverride(a.h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(a.h, func(c *Config) { c.PolicyMapMax = max })
	return a
}

func (a *agent) start(t testing.TB) {
	t.Helper()
	if err := a.h.Start(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (a *agent) stop(t testing.TB) {
	t.Helper()
	if err := a.h.Stop(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatal(err)
	}
}

func entry(ep uint16, dir policy.Direction, id uint32, proto uint8, port, end uint16) *policy.Entry {
	return &policy.Entry{
		Key:      policy.EntryKey{EndpointID: ep, Direction: dir, Identity: identityOf(id), Protocol: proto, Port: port, EndPort: end},
		Policies: []string{"default/test"},
		Status:   reconciler.StatusPending(),
	}
}

func (a *agent) put(objs ...any) {
	txn := a.db.WriteTxn(a.entries, a.enforcement, a.prefixes)
	for _, o := range objs {
		switch o := o.(type) {
		case *policy.Prefix:
			o.Status = reconciler.StatusPending()
			a.prefixes.Insert(txn, o)
		case *policy.Entry:
			a.entries.Insert(txn, o)
		case *policy.Enforcement:
			o.Status = reconciler.StatusPending()
			a.enforcement.Insert(txn, o)
		}
	}
	txn.Commit()
}

func (a *agent) deleteEntry(e *policy.Entry) {
	txn := a.db.WriteTxn(a.entries)
	a.entries.Delete(txn, e)
	txn.Commit()
}

// reconciled waits until every row is Done.
func (a *agent) reconciled(t *testing.T) {
	t.Helper()
	celltest.Eventually(t, "policy rows reconciled", func() (bool, string) {
		txn := a.db.ReadTxn()
		for e := range a.entries.All(txn) {
			if e.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("entry %+v", e)
			}
		}
		for e := range a.enforcement.All(txn) {
			if e.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("enforcement %+v", e)
			}
		}
		for p := range a.prefixes.All(txn) {
			if p.Status.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("prefix %+v", p)
			}
		}
		return true, ""
	})
}

// dump is the policy map's keys, sorted.
func (a *agent) dump(t *testing.T) []string {
	t.Helper()
	var keys []string
	if err := a.maps.Policy.Iterate(func(k policymap.Key, v policymap.Value) bool {
		s := k.String()
		if v.PrefixLen != k.PrefixLen {
			s += " (value of another key)"
		}
		keys = append(keys, s)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

func (a *agent) enforcementOf(t *testing.T, ep uint16) (uint8, bool) {
	t.Helper()
	v, err := a.maps.Enforcement.Lookup(uint32(ep))
	if err != nil {
		return 0, false
	}
	return v.Flags, true
}

func (a *agent) writes() float64 {
	return testutil.ToFloat64(a.metrics.writes.WithLabelValues("policy", "update")) +
		testutil.ToFloat64(a.metrics.writes.WithLabelValues("policy", "delete")) +
		testutil.ToFloat64(a.metrics.writes.WithLabelValues("enforcement", "update")) +
		testutil.ToFloat64(a.metrics.writes.WithLabelValues("enforcement", "delete")) +
		testutil.ToFloat64(a.metrics.writes.WithLabelValues("prefix", "update")) +
		testutil.ToFloat64(a.metrics.writes.WithLabelValues("prefix", "delete"))
}

// prefixes is the prefix trie, as "PREFIX=ID", sorted.
func (a *agent) prefixDump(t *testing.T) []string {
	t.Helper()
	var out []string
	if err := a.maps.Prefixes.Iterate(func(k policymap.PrefixKey, v policymap.PrefixValue) bool {
		out = append(out, fmt.Sprintf("%s=%d", k.Prefix(), v.ID))
		return true
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func wantKeys(t *testing.T, got []string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("policy map:\n got %q\nwant %q", got, want)
	}
}

// waitPrunes waits for a prune of the three reconcilers.
func (a *agent) waitPrunes(t *testing.T) {
	t.Helper()
	awaitSignals(t, "prunes", a.signal.pruned, "entries", "enforcement", "prefixes")
}

// awaitSignals waits until ch has said each of want.
func awaitSignals(t *testing.T, what string, ch <-chan string, want ...string) {
	t.Helper()
	seen := map[string]bool{}
	timeout := time.After(10 * time.Second)
	for !allSeen(seen, want) {
		select {
		case s := <-ch:
			seen[s] = true
		case <-timeout:
			t.Fatalf("%s seen within 10s %v, want %q", what, seen, want)
		}
	}
}

func allSeen(seen map[string]bool, want []string) bool {
	for _, w := range want {
		if !seen[w] {
			return false
		}
	}
	return true
}

// Rows become keys and flags; a deleted entry takes only the keys no other
// entry of its endpoint needs.
func TestEntriesIntoMaps(t *testing.T) {
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	a.start(t)
	defer a.stop(t)

	web := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0)
	wide := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 8000, 8010)
	narrow := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 8000, 8007)
	anyProto := entry(12, policy.Egress, 2000, 0, 0, 0)
	dns := entry(13, policy.Egress, 0, unix.IPPROTO_UDP, 53, 0)
	a.put(web, wide, narrow, anyProto, dns,
		&policy.Enforcement{EndpointID: 12, Ingress: true, Egress: true},
		&policy.Enforcement{EndpointID: 13, Egress: true})
	a.reconciled(t)
	wantKeys(t, a.dump(t),
		"ep 12 ingress id 1000 proto 6 port 80-80",
		"ep 12 ingress id 1000 proto 6 port 8000-8007",
		"ep 12 ingress id 1000 proto 6 port 8008-8009",
		"ep 12 ingress id 1000 proto 6 port 8010-8010",
		"ep 12 egress id 2000 any",
		"ep 13 egress id 0 proto 17 port 53-53")
	if f, ok := a.enforcementOf(t, 12); !ok || f != policymap.FlagIngress|policymap.FlagEgress {
		t.Fatalf("endpoint 12 enforcement %#x (%v), want ingress|egress", f, ok)
	}
	if f, ok := a.enforcementOf(t, 13); !ok || f != policymap.FlagEgress {
		t.Fatalf("endpoint 13 enforcement %#x (%v), want egress", f, ok)
	}

	// 8000-8007 is also narrow's: it stays.
	a.deleteEntry(wide)
	celltest.Eventually(t, "wide's own keys deleted", func() (bool, string) { d := a.dump(t); return len(d) == 4, fmt.Sprint(d) })
	wantKeys(t, a.dump(t),
		"ep 12 ingress id 1000 proto 6 port 80-80",
		"ep 12 ingress id 1000 proto 6 port 8000-8007",
		"ep 12 egress id 2000 any",
		"ep 13 egress id 0 proto 17 port 53-53")

	txn := a.db.WriteTxn(a.enforcement)
	a.enforcement.Delete(txn, &policy.Enforcement{EndpointID: 13})
	txn.Commit()
	celltest.Eventually(t, "endpoint 13's enforcement deleted", func() (bool, string) { f, ok := a.enforcementOf(t, 13); return !ok, fmt.Sprintf("flags %v", f) })
}

// cookieOf is the cookie in the trie of an entry's first key.
func (a *agent) cookieOf(t *testing.T, e *policy.Entry) uint32 {
	t.Helper()
	keys, err := keysOf(e.Key)
	if err != nil {
		t.Fatal(err)
	}
	v, err := a.maps.Policy.Lookup(keys[0])
	if err != nil {
		t.Fatal(err)
	}
	return v.Cookie
}

// An entry's keys hold the cookie of its policies, which follows them
// when they change: the verdict events' allowed_by.
func TestCookieFollowsPolicies(t *testing.T) {
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	a.start(t)
	defer a.stop(t)
	web := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0)
	a.put(web)
	a.reconciled(t)
	if c := a.cookieOf(t, web); c != policymap.Cookie([]string{"default/test"}) {
		t.Fatalf("cookie %#x, want that of default/test", c)
	}
	two := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0)
	two.Policies = []string{"default/other", "default/test"}
	a.put(two)
	a.reconciled(t)
	if c := a.cookieOf(t, web); c != policymap.Cookie(two.Policies) {
		t.Fatalf("cookie %#x after a second policy, want that of both", c)
	}
}

// A key two entries of an endpoint share (overlapping port ranges) holds
// the cookie of the one written last; when that one goes, the key stays
// and takes the other's cookie.
func TestSharedKeyCookieOnDelete(t *testing.T) {
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	a.start(t)
	defer a.stop(t)
	// 80-81 is the key 80/15; 80-82 is 80/15 and 82/16.
	first := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 81)
	first.Policies = []string{"default/first"}
	a.put(first)
	a.reconciled(t)
	second := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 82)
	second.Policies = []string{"default/second"}
	a.put(second)
	a.reconciled(t)
	if c := a.cookieOf(t, first); c != policymap.Cookie(second.Policies) {
		t.Fatalf("shared key's cookie %#x, want that of the entry written last", c)
	}
	a.deleteEntry(second)
	celltest.Eventually(t, "82/16 deleted", func() (bool, string) { d := a.dump(t); return len(d) == 1, fmt.Sprint(d) })
	if c := a.cookieOf(t, first); c != policymap.Cookie(first.Policies) {
		t.Fatalf("shared key's cookie %#x after the other entry went, want that of default/first", c)
	}
}

// Prefix rows become prefix trie entries with their IDs, a prefix inside
// another one too, and go with their rows.
func TestPrefixesIntoMap(t *testing.T) {
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	a.start(t)
	defer a.stop(t)
	wide := &policy.Prefix{Prefix: netip.MustParsePrefix("10.0.0.0/8"), ID: 1 << 30}
	narrow := &policy.Prefix{Prefix: netip.MustParsePrefix("10.1.0.0/16"), ID: 1<<30 + 7}
	v6 := &policy.Prefix{Prefix: netip.MustParsePrefix("::/0"), ID: 1<<30 + 9}
	a.put(wide, narrow, v6)
	a.reconciled(t)
	want := []string{fmt.Sprintf("10.0.0.0/8=%d", 1<<30), fmt.Sprintf("10.1.0.0/16=%d", 1<<30+7), fmt.Sprintf("::/0=%d", 1<<30+9)}
	slices.Sort(want)
	if got := a.prefixDump(t); !slices.Equal(got, want) {
		t.Fatalf("prefix trie %v, want %v", got, want)
	}
	txn := a.db.WriteTxn(a.prefixes)
	a.prefixes.Delete(txn, narrow)
	txn.Commit()
	celltest.Eventually(t, "10.1.0.0/16 deleted", func() (bool, string) { d := a.prefixDump(t); return len(d) == 2, fmt.Sprint(d) })
	if got := a.prefixDump(t); got[0] != fmt.Sprintf("10.0.0.0/8=%d", 1<<30) {
		t.Fatalf("prefix trie %v, want 10.0.0.0/8 and ::/0", got)
	}
}

// A restart with the same rows rewrites nothing; what the new run does not
// want goes only once the tables are initialized.
func TestRestartWritesNothing(t *testing.T) {
	root := bpfmapstest.Root(t)
	rows := func() []any {
		return []any{
			entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0),
			entry(12, policy.Ingress, 0, unix.IPPROTO_TCP, 1024, 65535),
			entry(12, policy.Egress, 2000, 0, 0, 0),
			&policy.Enforcement{EndpointID: 12, Ingress: true, Egress: true},
			&policy.Prefix{Prefix: netip.MustParsePrefix("10.1.0.0/16"), ID: 1 << 30},
		}
	}
	first := newAgent(t, root, 1<<16)
	first.start(t)
	first.put(append(rows(), entry(14, policy.Ingress, 3000, unix.IPPROTO_UDP, 0, 0),
		&policy.Enforcement{EndpointID: 14, Ingress: true},
		&policy.Prefix{Prefix: netip.MustParsePrefix("10.1.2.0/24"), ID: 1<<30 + 1})...)
	first.done()
	first.reconciled(t)
	if w := first.writes(); w != 13 {
		t.Fatalf("first run wrote %v times, want 13 (8 keys and the flags of endpoint 12, 1 key and the flags of 14, 2 prefixes)", w)
	}
	before := first.dump(t)
	first.stop(t)

	second := newAgent(t, root, 1<<16)
	second.start(t)
	defer second.stop(t)
	if o := second.maps.Policy.Origin(); o != bpfmaps.OriginReused {
		t.Fatalf("policy map %s, want reused", o)
	}
	// Endpoint 14 is gone in this run; the same rows for 12.
	second.put(rows()...)
	second.reconciled(t)
	if w := second.writes(); w != 0 {
		t.Fatalf("restart wrote %v times, want 0", w)
	}
	// Not initialized: endpoint 14's state stays.
	wantKeys(t, second.dump(t), before...)
	if _, ok := second.enforcementOf(t, 14); !ok {
		t.Fatal("endpoint 14's enforcement pruned before the tables were initialized")
	}

	second.done()
	second.waitPrunes(t)
	want := slices.DeleteFunc(slices.Clone(before), func(k string) bool { return strings.HasPrefix(k, "ep 14 ") })
	wantKeys(t, second.dump(t), want...)
	if _, ok := second.enforcementOf(t, 14); ok {
		t.Fatal("endpoint 14's enforcement not pruned")
	}
	if got := second.prefixDump(t); !slices.Equal(got, []string{fmt.Sprintf("10.1.0.0/16=%d", 1<<30)}) {
		t.Fatalf("prefixes after the prune %v, want 10.1.0.0/16 alone", got)
	}
	if w := second.writes(); w != 3 {
		t.Fatalf("restart wrote %v times, want 3 (endpoint 14's key and flags and 10.1.2.0/24 pruned)", w)
	}
}

// A full map fails the entry and its endpoint, with health naming it,
// and counts; room again clears both.
func TestMapFull(t *testing.T) {
	a := newAgent(t, bpfmapstest.Root(t), 4)
	a.start(t)
	defer a.stop(t)

	small := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0)
	wide := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 1, 65535) // 16 keys
	a.put(small, wide, &policy.Enforcement{EndpointID: 12, Ingress: true})

	var got *policy.Entry
	celltest.Eventually(t, "the wide entry failed", func() (bool, string) {
		got, _, _ = a.entries.Get(a.db.ReadTxn(), policy.EntryByKey.Query(wide.Key))
		return got.Status.Kind == reconciler.StatusKindError, fmt.Sprintf("status %v", got.Status)
	})
	if !strings.Contains(got.Status.GetError(), "endpoint 12: policy map cellium_policy is full (--policy-map-max=4)") {
		t.Fatalf("status error %q, want the endpoint and the flag named", got.Status.GetError())
	}
	var st *health.Status
	celltest.Eventually(t, "endpoint 12 degraded", func() (bool, string) {
		var found bool
		st, _, found = a.health.Get(a.db.ReadTxn(), health.StatusID.Query("policy-maps.endpoint-12"))
		return found && st.Level == cell.StatusDegraded, fmt.Sprintf("found %v: %+v", found, st)
	})
	if !strings.Contains(st.Message, "Endpoint 12") {
		t.Fatalf("health %+v, want the endpoint named", st)
	}
	if n := testutil.ToFloat64(a.metrics.full); n < 1 {
		t.Fatalf("full counted %v, want at least 1", n)
	}
	// Never a silent allow: the endpoint is isolated with part of its
	// allows (the enforcement reconciler writes the flags once no entry
	// is Pending, the failed one included, in its own time).
	celltest.Eventually(t, "endpoint 12 isolated", func() (bool, string) {
		f, ok := a.enforcementOf(t, 12)
		return ok && f == policymap.FlagIngress, fmt.Sprintf("enforcement %#x (%v)", f, ok)
	})

	a.deleteEntry(wide)
	a.put(entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 8000, 8001))
	a.reconciled(t)
	celltest.Eventually(t, "endpoint 12's failure cleared", func() (bool, string) {
		st, _, found := a.health.Get(a.db.ReadTxn(), health.StatusID.Query("policy-maps.endpoint-12"))
		return !found, fmt.Sprintf("%+v", st)
	})
}

// A key deleted and flags changed behind the agent's back are put back
// by the refresh, and counted.
func TestDriftRepaired(t *testing.T) {
	defer func(d time.Duration) { refreshInterval = d }(refreshInterval)
	refreshInterval = 50 * time.Millisecond
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	a.start(t)
	defer a.stop(t)
	e := entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 81)
	a.put(e, &policy.Enforcement{EndpointID: 12, Ingress: true})
	a.reconciled(t)
	want := a.dump(t)
	keys, err := policymap.KeysOf(allowOf(e.Key))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.maps.Policy.Delete(keys[0]); err != nil {
		t.Fatal(err)
	}
	if err := a.maps.Enforcement.Put(12, policymap.Enforcement{}); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "drift repaired", func() (bool, string) {
		f, _ := a.enforcementOf(t, 12)
		d := a.dump(t)
		return slices.Equal(d, want) && f == policymap.FlagIngress, fmt.Sprintf("%v, flags %v", d, f)
	})
	celltest.Eventually(t, "repairs counted", func() (bool, string) { n := testutil.ToFloat64(a.metrics.repairs); return n == 2, fmt.Sprint(n) })
}

func identityOf(id uint32) identity.NumericIdentity { return identity.NumericIdentity(id) }

// TestPrefixTrieFullKeepsExcept: with the prefix trie full, an ipBlock's
// cidr is never in the trie without its except, so the block's allow never
// covers the except's addresses; health names the prefixes and the policy;
// once there is room, both go in.
//   - the except refused by the full trie, then one slot freed and the
//     cidr added: the cidr does not take the slot (its except is not in),
//     the except's retry does; an address of the except, looked up all
//     along, never resolves to the cidr's ID;
//   - an except refused, its cidr refused with it, then the except deleted
//     (its policy changed): the cidr goes in on its own;
//   - an except added to a cidr already in a full trie: the except is
//     refused and the cidr taken out.
func TestPrefixTrieFullKeepsExcept(t *testing.T) {
	cidr := &policy.Prefix{Prefix: netip.MustParsePrefix("10.0.0.0/8"), ID: 1 << 30}
	except := &policy.Prefix{Prefix: netip.MustParsePrefix("10.1.0.0/16"), ID: 1<<30 + 7}
	allow := entry(12, policy.Ingress, uint32(cidr.ID), unix.IPPROTO_TCP, 80, 80)
	allow.Policies = []string{"prod/ipblock"}
	setup := func(t *testing.T, free int) (*agent, []*policy.Prefix, func(string) uint32) {
		a := newAgent(t, bpfmapstest.Root(t), 1<<16)
		a.start(t)
		t.Cleanup(func() { a.stop(t) })
		var fill []*policy.Prefix
		var objs []any
		for i := range policymap.PrefixMaxEntries - free {
			p := &policy.Prefix{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(i>>8), byte(i), 0}), 24), ID: identity.NumericIdentity(1<<30 + 100 + i)}
			fill, objs = append(fill, p), append(objs, p)
		}
		a.put(objs...)
		a.reconciled(t)
		a.put(allow, &policy.Enforcement{EndpointID: 12, Ingress: true})
		a.reconciled(t)
		resolves := func(addr string) uint32 {
			v, err := a.maps.Prefixes.Lookup(policymap.PrefixKeyOf(netip.PrefixFrom(netip.MustParseAddr(addr), 32)))
			if err != nil {
				return 0
			}
			return v.ID
		}
		return a, fill, resolves
	}
	degraded := func(t *testing.T, a *agent, what string, ok func(*health.Status) bool) {
		t.Helper()
		celltest.Eventually(t, what, func() (bool, string) {
			st, _, _ := a.health.Get(a.db.ReadTxn(), health.StatusID.Query("policy-maps.prefixes"))
			return st != nil && st.Level == cell.StatusDegraded && ok(st), fmt.Sprintf("%+v", st)
		})
	}
	freeOne := func(a *agent, p *policy.Prefix) {
		txn := a.db.WriteTxn(a.prefixes)
		a.prefixes.Delete(txn, p)
		txn.Commit()
	}
	bothIn := func(t *testing.T, a *agent, resolves func(string) uint32) {
		t.Helper()
		celltest.Eventually(t, "the except and the cidr in the trie, health cleared", func() (bool, string) {
			st, _, found := a.health.Get(a.db.ReadTxn(), health.StatusID.Query("policy-maps.prefixes"))
			return !found && resolves("10.1.2.3") == uint32(except.ID) && resolves("10.2.0.1") == uint32(cidr.ID),
				fmt.Sprintf("10.1.2.3 -> %d, 10.2.0.1 -> %d, health %+v", resolves("10.1.2.3"), resolves("10.2.0.1"), st)
		})
	}

	t.Run("cidr after its except", func(t *testing.T) {
		a, fill, resolves := setup(t, 0)
		var exceptSeenAsCidr atomic.Bool
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(stopped)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if resolves("10.1.2.3") == uint32(cidr.ID) {
					exceptSeenAsCidr.Store(true)
				}
			}
		}()
		a.put(except)
		degraded(t, a, "the except refused", func(st *health.Status) bool {
			return strings.Contains(st.Error, "10.1.0.0/16 not written: the prefix trie "+policymap.PrefixMapName+" is full")
		})
		// One slot freed and the cidr added in one transaction: the cidr
		// comes before the except's retry and must not take the slot.
		txn := a.db.WriteTxn(a.prefixes)
		a.prefixes.Delete(txn, fill[0])
		c := *cidr
		c.Status = reconciler.StatusPending()
		a.prefixes.Insert(txn, &c)
		txn.Commit()
		celltest.Eventually(t, "the except in the trie, the cidr refused", func() (bool, string) {
			row, _, _ := a.prefixes.Get(a.db.ReadTxn(), policy.PrefixByPrefix.Query(cidr.Prefix))
			return resolves("10.1.2.3") == uint32(except.ID) && row.Status.Kind == reconciler.StatusKindError,
				fmt.Sprintf("10.1.2.3 -> %d, cidr %s", resolves("10.1.2.3"), row.Status)
		})
		close(stop)
		<-stopped
		if exceptSeenAsCidr.Load() {
			t.Fatal("an address of the except resolved to the cidr's ID")
		}
		degraded(t, a, "the cidr refused, health naming the policy", func(st *health.Status) bool {
			return strings.Contains(st.Error, "10.0.0.0/8 not written") && strings.Contains(st.Message, "NetworkPolicies prod/ipblock ")
		})
		freeOne(a, fill[1])
		bothIn(t, a, resolves)
	})

	t.Run("except deleted", func(t *testing.T) {
		a, fill, resolves := setup(t, 0)
		a.put(except)
		degraded(t, a, "the except refused", func(st *health.Status) bool {
			return strings.Contains(st.Error, "10.1.0.0/16 not written")
		})
		a.put(cidr)
		celltest.Eventually(t, "the cidr refused", func() (bool, string) {
			row, _, _ := a.prefixes.Get(a.db.ReadTxn(), policy.PrefixByPrefix.Query(cidr.Prefix))
			return row.Status.Kind == reconciler.StatusKindError, row.Status.String()
		})
		// The except no longer wanted (its policy changed) and a slot
		// freed: the cidr goes in on its own.
		txn := a.db.WriteTxn(a.prefixes)
		a.prefixes.Delete(txn, except)
		a.prefixes.Delete(txn, fill[0])
		txn.Commit()
		celltest.Eventually(t, "the cidr in the trie, health cleared", func() (bool, string) {
			st, _, found := a.health.Get(a.db.ReadTxn(), health.StatusID.Query("policy-maps.prefixes"))
			return !found && resolves("10.1.2.3") == uint32(cidr.ID), fmt.Sprintf("10.1.2.3 -> %d, health %+v", resolves("10.1.2.3"), st)
		})
	})

	t.Run("except added", func(t *testing.T) {
		a, fill, resolves := setup(t, 1)
		a.put(cidr)
		a.reconciled(t)
		a.put(except)
		degraded(t, a, "the except refused, the cidr withheld", func(st *health.Status) bool {
			return strings.Contains(st.Message, "withheld (10.0.0.0/8)") && strings.Contains(st.Message, "NetworkPolicies prod/ipblock ")
		})
		// Whichever holds the last slot now, never the cidr alone.
		if resolves("10.1.2.3") == uint32(cidr.ID) || resolves("10.2.0.1") == uint32(cidr.ID) {
			t.Fatalf("the cidr resolves without its except: 10.1.2.3 -> %d, 10.2.0.1 -> %d", resolves("10.1.2.3"), resolves("10.2.0.1"))
		}
		freeOne(a, fill[0])
		bothIn(t, a, resolves)
	})
}

// TestPolicyMapMaxChangedKeepsEntries: a restart with another
// --policy-map-max recreates the policy trie (its MaxEntries differs), with
// the old one's keys copied in: restored endpoints' programs, attached
// before the policy is written, allow what they allowed.
func TestPolicyMapMaxChangedKeepsEntries(t *testing.T) {
	root := bpfmapstest.Root(t)
	first := newAgent(t, root, 1<<16)
	first.start(t)
	first.put(entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0), entry(12, policy.Egress, 2000, 0, 0, 0),
		&policy.Enforcement{EndpointID: 12, Ingress: true, Egress: true})
	first.done()
	first.reconciled(t)
	before := first.dump(t)
	first.stop(t)

	second := newAgent(t, root, 1<<15)
	second.start(t)
	defer second.stop(t)
	if o := second.maps.Policy.Origin(); o != bpfmaps.OriginRecreated {
		t.Fatalf("policy map %s after --policy-map-max changed, want recreated", o)
	}
	if got := second.maps.Policy.EBPF().MaxEntries(); got != 1<<15 {
		t.Fatalf("policy map of %d entries, want %d", got, 1<<15)
	}
	// Nothing written yet in this run: the keys are the old map's.
	wantKeys(t, second.dump(t), before...)
}

// TestStrayKeysPruned: an allow, an endpoint's flags and a prefix added
// behind the agent's back (the allow opens the endpoint to a peer) are
// removed by the next prune, within pruneInterval (a minute), not the
// reconciler's default hour, and counted as repairs; the prune at the
// start counts nothing.
func TestStrayKeysPruned(t *testing.T) {
	defer func(d time.Duration) { pruneInterval = d }(pruneInterval)
	pruneInterval = 50 * time.Millisecond
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	a.start(t)
	defer a.stop(t)
	a.put(entry(12, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0), &policy.Enforcement{EndpointID: 12, Ingress: true},
		&policy.Prefix{Prefix: netip.MustParsePrefix("10.1.0.0/16"), ID: 1 << 30})
	a.done()
	a.reconciled(t)
	a.waitPrunes(t)
	if n := testutil.ToFloat64(a.metrics.repairs); n != 0 {
		t.Fatalf("repairs %v after the first prune, want 0", n)
	}
	keys, prefixes := a.dump(t), a.prefixDump(t)

	stray, err := policymap.KeysOf(allowOf(entry(12, policy.Ingress, 2000, unix.IPPROTO_TCP, 443, 0).Key))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.maps.Policy.Put(stray[0], policymap.Value{PrefixLen: stray[0].PrefixLen}); err != nil {
		t.Fatal(err)
	}
	if err := a.maps.Enforcement.Put(99, policymap.Enforcement{Flags: policymap.FlagIngress}); err != nil {
		t.Fatal(err)
	}
	if err := a.maps.Prefixes.Put(policymap.PrefixKeyOf(netip.MustParsePrefix("192.0.2.0/24")), policymap.PrefixValue{ID: 1<<30 + 5}); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the stray keys pruned and counted", func() (bool, string) {
		_, has99 := a.enforcementOf(t, 99)
		d, p, n := a.dump(t), a.prefixDump(t), testutil.ToFloat64(a.metrics.repairs)
		return slices.Equal(d, keys) && slices.Equal(p, prefixes) && !has99 && n == 3,
			fmt.Sprintf("keys %v, prefixes %v, flags of 99 %v, repairs %v", d, p, has99, n)
	})
}
