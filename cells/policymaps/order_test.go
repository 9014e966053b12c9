package policymaps

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/policymap"
)

// pair is a TCP connection a policy decides: to or from endpoint ep, in
// direction dir, with the peer identity id, on port.
type pair struct {
	ep   uint16
	dir  policy.Direction
	id   uint32
	port uint16
}

// ipPair is a pair whose peer is address ip: its identity is the ID the
// prefix map gives ip (an ipBlock's), the pair's id unused.
type ipPair struct {
	pair
	ip netip.Addr
}

func (p ipPair) String() string {
	return fmt.Sprintf("endpoint %d %s peer %s TCP/%d", p.ep, p.dir, p.ip, p.port)
}

// passesIP is passes for p's peer address.
func (a *agent) passesIP(t *testing.T, p ipPair) bool {
	t.Helper()
	v, err := a.maps.Prefixes.Lookup(policymap.PrefixKeyOf(netip.PrefixFrom(p.ip, p.ip.BitLen())))
	if err != nil {
		// No ipBlock's: an identity no allow of the test names.
		v.ID = 1 << 31
	}
	p.pair.id = v.ID
	return a.passes(t, p.pair)
}

func (p pair) String() string {
	return fmt.Sprintf("endpoint %d %s identity %d TCP/%d", p.ep, p.dir, p.id, p.port)
}

// passes is the datapath's verdict on p from the maps as they are now (as
// bpf/include/policy.h reads them): it passes unless its endpoint is
// isolated in its direction and no allow covers it.
func (a *agent) passes(t *testing.T, p pair) bool {
	t.Helper()
	flags, _ := a.enforcementOf(t, p.ep)
	bit := policymap.FlagIngress
	if p.dir == policy.Egress {
		bit = policymap.FlagEgress
	}
	if flags&bit == 0 {
		return true
	}
	keys, err := policymap.KeysOf(allowOf(policy.EntryKey{EndpointID: p.ep, Direction: p.dir, Identity: identityOf(p.id),
		Protocol: unix.IPPROTO_TCP, Port: p.port}))
	if err != nil || len(keys) != 1 {
		t.Fatalf("key of %s: %v, %v", p, keys, err)
	}
	_, err = a.maps.Policy.Lookup(keys[0])
	return err == nil
}

// freezer is the test's hook before every write of the policy and
// enforcement maps, once armed: it checks that the maps as they are (what
// an agent killed right there would leave the datapath enforcing) pass
// every pair of both, and it stops the first write to each map it has a
// gate for (the reconciler making it stands still, as a killed agent's
// would) until that gate is thawed.
type freezer struct {
	a     *agent
	t     *testing.T
	both  []pair
	ips   []ipPair
	gates map[string]*gate

	armed atomic.Bool

	mu     sync.Mutex
	writes int
	drops  []string
}

// gate stops the first write to one map until thaw.
type gate struct {
	once     sync.Once
	frozen   chan struct{}
	thawed   chan struct{}
	thawOnce sync.Once
}

func (g *gate) thaw() { g.thawOnce.Do(func() { close(g.thawed) }) }

// newFreezer freezes the first write to each of maps.
func newFreezer(a *agent, t *testing.T, both []pair, maps ...string) *freezer {
	f := &freezer{a: a, t: t, both: both, gates: map[string]*gate{}}
	for _, m := range maps {
		f.gates[m] = &gate{frozen: make(chan struct{}), thawed: make(chan struct{})}
	}
	return f
}

func (f *freezer) before(m, op string) {
	if !f.armed.Load() {
		return
	}
	f.check(fmt.Sprintf("before write %d (%s %s)", f.count(), m, op))
	if g := f.gates[m]; g != nil {
		g.once.Do(func() {
			close(g.frozen)
			<-g.thawed
		})
	}
}

// frozen waits until the first write to m is frozen.
func (f *freezer) frozen(m string) {
	f.t.Helper()
	select {
	case <-f.gates[m].frozen:
	case <-time.After(10 * time.Second):
		f.t.Fatalf("no write of the %s map within 10s", m)
	}
}

// thaw lets the writes of maps (all, if none) go on.
func (f *freezer) thaw(maps ...string) {
	if len(maps) == 0 {
		for _, g := range f.gates {
			g.thaw()
		}
	}
	for _, m := range maps {
		f.gates[m].thaw()
	}
}

func (f *freezer) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes++
	return f.writes
}

// check records each pair of both that the maps drop now.
func (f *freezer) check(when string) {
	for _, p := range f.both {
		if !f.a.passes(f.t, p) {
			f.mu.Lock()
			f.drops = append(f.drops, fmt.Sprintf("%s: %s dropped", when, p))
			f.mu.Unlock()
		}
	}
	for _, p := range f.ips {
		if !f.a.passesIP(f.t, p) {
			f.mu.Lock()
			f.drops = append(f.drops, fmt.Sprintf("%s: %s dropped", when, p))
			f.mu.Unlock()
		}
	}
}

// An endpoint's enforcement and its allows change in order, so that an
// agent killed at any point leaves the endpoint enforcing its old or its
// new policy, never dropping a pair both allow: isolation turns on only
// once its allows are written, and turns off before the allows it no longer
// needs are removed. Each change is stopped at the first write of the map
// that must come second (the "kill"), the other reconciler left to go as
// far as it goes; then the maps must pass every pair the old and the new
// policy both allow, as they must before every write of the change.
func TestEnforcementOrderedWithAllows(t *testing.T) {
	const ep = 21
	const tcp = unix.IPPROTO_TCP
	allows := func() []*policy.Entry {
		return []*policy.Entry{entry(ep, policy.Ingress, 1000, tcp, 80, 0), entry(ep, policy.Ingress, 1001, tcp, 443, 0),
			entry(ep, policy.Ingress, 1002, tcp, 8000, 8010)}
	}
	// Pairs that the open policy (not isolated) and the isolating one
	// both allow; the isolating one denies denied.
	both := []pair{{ep, policy.Ingress, 1000, 80}, {ep, policy.Ingress, 1001, 443}, {ep, policy.Ingress, 1002, 8005}}
	denied := pair{ep, policy.Ingress, 1003, 80}
	open := func() *policy.Enforcement { return &policy.Enforcement{EndpointID: ep} }
	isolated := func() *policy.Enforcement { return &policy.Enforcement{EndpointID: ep, Ingress: true} }

	for _, tc := range []struct {
		name string
		// from is the old policy; change writes the new one, as the
		// policy cell does, in one transaction.
		from   func(a *agent)
		change func(a *agent)
		// freeze is the map written second; held is what the other
		// reconciler waits for meanwhile (policy_map_held{what}).
		freeze, held string
		// settled says the other reconciler went as far as the broken
		// order would take it: the write that must come second done.
		settled func(a *agent) bool
		final   func(t *testing.T, a *agent)
	}{{
		name:   "isolation on",
		from:   func(a *agent) { a.put(open()) },
		change: func(a *agent) { a.put(append([]any{isolated()}, anys(allows())...)...) },
		freeze: "policy", held: "enforcement",
		settled: func(a *agent) bool {
			flags, _ := a.enforcementOf(t, ep)
			return flags&policymap.FlagIngress != 0
		},
		final: func(t *testing.T, a *agent) {
			if a.passes(t, denied) {
				t.Errorf("%s passes once the endpoint is isolated", denied)
			}
		},
	}, {
		name:   "isolation off",
		from:   func(a *agent) { a.put(append([]any{isolated()}, anys(allows())...)...) },
		change: func(a *agent) { a.replace(open(), allows()) },
		freeze: "enforcement", held: "allows",
		settled: func(a *agent) bool { return len(a.dump(t)) == 0 },
		final: func(t *testing.T, a *agent) {
			if keys := a.dump(t); len(keys) != 0 {
				t.Errorf("allows left once the endpoint is open: %q", keys)
			}
			if !a.passes(t, denied) {
				t.Errorf("%s dropped once the endpoint is open", denied)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAgent(t, bpfmapstest.Root(t), 1<<16)
			f := newFreezer(a, t, both, tc.freeze)
			a.start(t)
			defer a.stop(t)
			defer f.thaw() // before the stop, which waits for the reconcilers
			a.metrics.beforeWrite = f.before
			tc.from(a)
			a.done()
			a.reconciled(t)
			f.check("the old policy")

			f.armed.Store(true)
			tc.change(a)
			f.frozen(tc.freeze)
			celltest.Eventually(t, "the other reconciler held, or past the write that must come second", func() (bool, string) {
				held := testutil.ToFloat64(a.metrics.held.WithLabelValues(tc.held))
				return held > 0 || tc.settled(a), fmt.Sprintf("policy_map_held{what=%s} %v", tc.held, held)
			})
			f.check("killed there")
			f.thaw()
			a.reconciled(t)
			f.armed.Store(false)
			f.check("the new policy")
			tc.final(t, a)
			for _, what := range []string{"enforcement", "allows"} {
				if held := testutil.ToFloat64(a.metrics.held.WithLabelValues(what)); held != 0 {
					t.Errorf("policy_map_held{what=%s} %v once reconciled, want 0", what, held)
				}
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.writes == 0 {
				t.Fatal("the change wrote nothing")
			}
			for _, d := range f.drops {
				t.Error(d)
			}
		})
	}
}

func anys[T any](xs []T) []any {
	out := make([]any, len(xs))
	for i, x := range xs {
		out[i] = x
	}
	return out
}

// replace writes enf and deletes entries in one transaction.
func (a *agent) replace(enf *policy.Enforcement, entries []*policy.Entry) {
	txn := a.db.WriteTxn(a.entries, a.enforcement)
	enf.Status = reconciler.StatusPending()
	a.enforcement.Insert(txn, enf)
	for _, e := range entries {
		a.entries.Delete(txn, e)
	}
	txn.Commit()
}

// allReconciled waits until every row of tbl is Done.
func allReconciled[T any](t *testing.T, a *agent, what string, tbl statedb.Table[T], status func(T) reconciler.Status) {
	t.Helper()
	celltest.Eventually(t, what+" reconciled", func() (bool, string) {
		for r := range tbl.All(a.db.ReadTxn()) {
			if s := status(r); s.Kind != reconciler.StatusKindDone {
				return false, fmt.Sprintf("%+v", r)
			}
		}
		return true, ""
	})
}

func entryStatus(e *policy.Entry) reconciler.Status             { return e.Status }
func enforcementStatus(e *policy.Enforcement) reconciler.Status { return e.Status }

// finish checks the maps where the change stands (killed there), lets it
// go on, and checks them again once every row is reconciled.
func (f *freezer) finish(t *testing.T) {
	t.Helper()
	f.check("killed there")
	f.thaw()
	f.a.reconciled(t)
	f.armed.Store(false)
	f.check("the last policy")
}

// verify fails t with each drop the freezer saw.
func (f *freezer) verify(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.drops {
		t.Error(d)
	}
	for _, what := range []string{"enforcement", "allows"} {
		if held := testutil.ToFloat64(f.a.metrics.held.WithLabelValues(what)); held != 0 {
			t.Errorf("policy_map_held{what=%s} %v once reconciled, want 0", what, held)
		}
	}
}

// An isolation whose reconciler waited for its allows is not written once
// its row has moved on: open, then isolated with an allow (its write
// frozen), then open again without it before the allow was written. The
// enforcement's wait ends when the allow's row goes; writing the isolation
// then would isolate the endpoint with none of its allows.
func TestStaleIsolationNotWritten(t *testing.T) {
	const ep = 22
	allow := func() []*policy.Entry {
		return []*policy.Entry{entry(ep, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0)}
	}
	// The first and last policy are open: they allow anything.
	both := []pair{{ep, policy.Ingress, 1000, 80}, {ep, policy.Ingress, 1003, 80}}
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	f := newFreezer(a, t, both, "policy")
	a.start(t)
	defer a.stop(t)
	defer f.thaw()
	a.metrics.beforeWrite = f.before
	a.put(&policy.Enforcement{EndpointID: ep})
	a.done()
	a.reconciled(t)

	f.armed.Store(true)
	a.put(append([]any{&policy.Enforcement{EndpointID: ep, Ingress: true}}, anys(allow())...)...)
	f.frozen("policy")
	celltest.Eventually(t, "the isolation waiting for its allow", func() (bool, string) {
		held := testutil.ToFloat64(a.metrics.held.WithLabelValues("enforcement"))
		return held > 0, fmt.Sprintf("policy_map_held{what=enforcement} %v", held)
	})
	a.replace(&policy.Enforcement{EndpointID: ep}, allow())
	allReconciled(t, a, "enforcement", statedb.Table[*policy.Enforcement](a.enforcement), enforcementStatus)
	f.finish(t)
	a.wantOpen(t, ep)
	f.verify(t)
}

// The allows an entry's removal holds back are decided with the entries
// reconciler's own view of the enforcement row, the one in which the
// allows are gone: isolated with allow X, then open without X (the
// enforcement's write frozen: the map stays isolated), then isolated with
// X again before the entries reconciler removed X. Judged by the newest
// row (isolated), X's removal would not be held and X would be missing
// from the isolated endpoint until written again.
func TestHeldAcrossReisolation(t *testing.T) {
	const ep = 23
	x := func() *policy.Entry { return entry(ep, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0) }
	isolated := func() *policy.Enforcement { return &policy.Enforcement{EndpointID: ep, Ingress: true} }
	// The first and last policy allow X; the middle one is open.
	both := []pair{{ep, policy.Ingress, 1000, 80}}
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	f := newFreezer(a, t, both, "policy", "enforcement")
	a.start(t)
	defer a.stop(t)
	defer f.thaw()
	a.metrics.beforeWrite = f.before
	a.put(isolated(), x())
	a.done()
	a.reconciled(t)

	f.armed.Store(true)
	// Open, with a new egress allow Y written first, so that the entries
	// reconciler stops at Y holding the view in which X is gone.
	txn := a.db.WriteTxn(a.entries, a.enforcement)
	a.enforcement.Insert(txn, &policy.Enforcement{EndpointID: ep, Status: reconciler.StatusPending()})
	a.entries.Insert(txn, entry(ep, policy.Egress, 2000, unix.IPPROTO_TCP, 53, 0))
	a.entries.Delete(txn, x())
	txn.Commit()
	f.frozen("policy")
	f.frozen("enforcement")
	a.put(isolated(), x())
	f.thaw("policy")
	allReconciled(t, a, "entries", statedb.Table[*policy.Entry](a.entries), entryStatus)
	f.finish(t)
	if flags, _ := a.enforcementOf(t, ep); flags != policymap.FlagIngress {
		t.Errorf("enforcement flags %#x once isolated again, want ingress", flags)
	}
	f.verify(t)
}

// A restart keeps the allows of an endpoint whose isolation is to turn off
// until it is off: the first run isolated the endpoint with allow X; the
// second (a policy opened while the agent was down, or an agent killed
// while it held X) has it open without X. Its entries' prune, at the
// tables' initialization, must not remove X before the enforcement's write
// of the open flags (frozen here), and that write removes it.
func TestPruneHoldsUntilOpen(t *testing.T) {
	const ep = 24
	const id = 1<<30 + 4
	root := bpfmapstest.Root(t)
	first := newAgent(t, root, 1<<16)
	first.start(t)
	first.put(&policy.Enforcement{EndpointID: ep, Ingress: true, Egress: true}, entry(ep, policy.Ingress, 1000, unix.IPPROTO_TCP, 80, 0),
		entry(ep, policy.Egress, id, unix.IPPROTO_TCP, 80, 0), &policy.Prefix{Prefix: netip.MustParsePrefix("10.7.0.0/16"), ID: id})
	first.done()
	first.reconciled(t)
	first.stop(t)

	// Both policies allow X and the ipBlock's address (the second is
	// open).
	a := newAgent(t, root, 1<<16)
	f := newFreezer(a, t, []pair{{ep, policy.Ingress, 1000, 80}}, "enforcement")
	f.ips = []ipPair{{pair{ep: ep, dir: policy.Egress, port: 80}, netip.MustParseAddr("10.7.0.1")}}
	a.start(t)
	defer a.stop(t)
	defer f.thaw()
	a.metrics.beforeWrite = f.before
	f.armed.Store(true)
	a.put(&policy.Enforcement{EndpointID: ep})
	f.frozen("enforcement")
	a.done()
	awaitSignals(t, "prunes", a.signal.pruned, "entries", "prefixes")
	f.check("killed after the prunes")
	for what, want := range map[string]float64{"allows": 2, "prefixes": 1} {
		if held := testutil.ToFloat64(a.metrics.held.WithLabelValues(what)); held != want {
			t.Errorf("policy_map_held{what=%s} %v after the prunes, want %v", what, held, want)
		}
	}
	f.thaw()
	a.reconciled(t)
	f.armed.Store(false)
	a.wantOpen(t, ep)
	if got := a.prefixDump(t); len(got) != 0 {
		t.Errorf("prefixes left once open: %v", got)
	}
	f.verify(t)
}

// An isolation waits for the prefixes its ipBlock allows match through,
// written by a reconciler of their own: open, then isolated in egress with
// an allow of an ipBlock whose prefix's write is frozen. The allow is
// written; the isolation must wait for the prefix too, else the address
// has no identity the allow names and is dropped.
func TestIsolationWaitsForPrefixes(t *testing.T) {
	const ep = 25
	const id = 1<<30 + 5
	peer := ipPair{pair{ep: ep, dir: policy.Egress, port: 80}, netip.MustParseAddr("10.9.0.1")}
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	f := newFreezer(a, t, nil, "prefix")
	f.ips = []ipPair{peer}
	waits := make(chan [2]int, 16)
	a.start(t)
	defer a.stop(t)
	defer f.thaw()
	a.metrics.beforeWrite = f.before
	a.metrics.waiting = func(endpoint uint16, entries, prefixes int) {
		if endpoint == ep {
			select {
			case waits <- [2]int{entries, prefixes}:
			default:
			}
		}
	}
	a.put(&policy.Enforcement{EndpointID: ep})
	a.done()
	a.reconciled(t)

	f.armed.Store(true)
	a.put(&policy.Enforcement{EndpointID: ep, Egress: true}, entry(ep, policy.Egress, id, unix.IPPROTO_TCP, 80, 0),
		&policy.Prefix{Prefix: netip.MustParsePrefix("10.9.0.0/16"), ID: id})
	f.frozen("prefix")
	timeout := time.After(10 * time.Second)
	for waiting := false; !waiting; {
		select {
		case w := <-waits:
			// Waiting with the allow written: for the prefix alone.
			waiting = w[0] == 0 && w[1] > 0
		case <-timeout:
			flags, _ := a.enforcementOf(t, ep)
			t.Fatalf("no wait of the isolation for the prefix alone within 10s (enforcement flags %#x, the prefix not written)", flags)
		}
		if flags, _ := a.enforcementOf(t, ep); flags != 0 {
			t.Fatalf("endpoint isolated (flags %#x) before its prefix was written", flags)
		}
	}
	f.finish(t)
	if flags, _ := a.enforcementOf(t, ep); flags != policymap.FlagEgress {
		t.Errorf("enforcement flags %#x once reconciled, want egress", flags)
	}
	if !a.passesIP(t, peer) {
		t.Errorf("%s dropped once reconciled", peer)
	}
	f.verify(t)
}

// wantOpen checks that endpoint ep is open, with no allow left.
func (a *agent) wantOpen(t *testing.T, ep uint16) {
	t.Helper()
	if flags, _ := a.enforcementOf(t, ep); flags != 0 {
		t.Errorf("endpoint %d: enforcement flags %#x once open, want 0", ep, flags)
	}
	if keys := a.dump(t); len(keys) != 0 {
		t.Errorf("endpoint %d: allows left once open: %q", ep, keys)
	}
}

// A prefix stays while an isolation is to turn off: isolated in egress with
// an ipBlock allow, then open without it (the enforcement's write frozen,
// the map still isolated). The allow is held until the isolation is off;
// the prefix its ID is matched through must be too, else the address has
// no identity the allow names.
func TestPrefixHeldUntilOpen(t *testing.T) {
	const ep = 26
	const id = 1<<30 + 6
	peer := ipPair{pair{ep: ep, dir: policy.Egress, port: 80}, netip.MustParseAddr("10.8.0.1")}
	allow := func() *policy.Entry { return entry(ep, policy.Egress, id, unix.IPPROTO_TCP, 80, 0) }
	prefix := func() *policy.Prefix { return &policy.Prefix{Prefix: netip.MustParsePrefix("10.8.0.0/16"), ID: id} }
	a := newAgent(t, bpfmapstest.Root(t), 1<<16)
	f := newFreezer(a, t, nil, "enforcement")
	f.ips = []ipPair{peer}
	a.signal.ops = make(chan string, 64)
	a.start(t)
	defer a.stop(t)
	defer f.thaw()
	a.metrics.beforeWrite = f.before
	a.put(&policy.Enforcement{EndpointID: ep, Egress: true}, allow(), prefix())
	a.done()
	a.reconciled(t)

	f.armed.Store(true)
	txn := a.db.WriteTxn(a.entries, a.enforcement, a.prefixes)
	a.enforcement.Insert(txn, &policy.Enforcement{EndpointID: ep, Status: reconciler.StatusPending()})
	a.entries.Delete(txn, allow())
	a.prefixes.Delete(txn, prefix())
	txn.Commit()
	f.frozen("enforcement")
	awaitSignals(t, "reconciliations", a.signal.ops, "entries delete", "prefixes delete")
	f.finish(t)
	a.wantOpen(t, ep)
	if got := a.prefixDump(t); len(got) != 0 {
		t.Errorf("prefixes left once open: %v", got)
	}
	f.verify(t)
	if held := testutil.ToFloat64(a.metrics.held.WithLabelValues("prefixes")); held != 0 {
		t.Errorf("policy_map_held{what=prefixes} %v once reconciled, want 0", held)
	}
}
