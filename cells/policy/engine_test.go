package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/pkg/identity"
)

// rows are the revisions of every row of both output tables, by key.
func (f *fixture) rows() map[string]uint64 {
	out := map[string]uint64{}
	txn := f.db.ReadTxn()
	for e, rev := range f.entries.All(txn) {
		out[e.Key.String()] = rev
	}
	for e, rev := range f.enforcement.All(txn) {
		out[fmt.Sprint("enforcement ", e.EndpointID)] = rev
	}
	return out
}

// changedRows are the keys whose row is new, gone or rewritten.
func changedRows(before, after map[string]uint64) []string {
	var out []string
	for k, rev := range after {
		if before[k] != rev {
			out = append(out, "written "+k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			out = append(out, "deleted "+k)
		}
	}
	return out
}

func namedPolicy(np *networkingv1.NetworkPolicy, name string) *networkingv1.NetworkPolicy {
	np.Name = name
	return np
}

func incrementalFixture(t *testing.T) *fixture {
	f := newFixture(t)
	// Two revisions: web's endpoint has an older one than the engine.
	f.apply(namedPolicy(netpol("prod", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
		{From: []networkingv1.NetworkPolicyPeer{podSel(client)}, Ports: []networkingv1.NetworkPolicyPort{port("", 8080)}}}}), "web"))
	f.apply(namedPolicy(netpol("prod", db, networkingv1.NetworkPolicySpec{Ingress: from(nss(map[string]string{"team": "b"}))}), "db"))
	return f
}

// TestNewIdentityWritesOnlyItsEntries: an identity a selector selects
// adds the entries of the endpoints whose policies use the selector, and
// no other row is written; when it goes, they go, and nothing else.
func TestNewIdentityWritesOnlyItsEntries(t *testing.T) {
	f := incrementalFixture(t)
	before := f.rows()
	f.e.addIdentity(2000, podIdentityLabels("prod", map[string]string{"app": "client", "v": "2"}, namespaces["prod"]))
	f.flush()
	want := EntryKey{EndpointID: 1, Direction: Ingress, Identity: 2000, Protocol: ProtoTCP, Port: 8080}
	after := f.rows()
	if got := changedRows(before, after); len(got) != 1 || got[0] != "written "+want.String() {
		t.Fatalf("a new client identity changed %v, want only the entry %s", got, want)
	}

	// An identity no selector selects writes nothing.
	f.e.addIdentity(2001, podIdentityLabels("prod", map[string]string{"app": "other"}, namespaces["prod"]))
	f.flush()
	if got := changedRows(after, f.rows()); len(got) != 0 {
		t.Fatalf("an identity no policy selects changed %v", got)
	}

	f.e.removeIdentity(2000)
	f.flush()
	if got := changedRows(after, f.rows()); len(got) != 1 || got[0] != "deleted "+want.String() {
		t.Fatalf("removing the identity changed %v, want only the entry %s deleted", got, want)
	}
}

// TestNoopRecomputeWritesNothing: recomputing from the same inputs writes
// no row.
func TestNoopRecomputeWritesNothing(t *testing.T) {
	f := incrementalFixture(t)
	before := f.rows()
	for name, r := range maps.Clone(f.e.rules) {
		cp := *r
		f.e.setRule(name, &cp)
	}
	for _, st := range f.e.endpoints {
		ep := st.ep.Clone()
		ep.MapStatus = reconciler.StatusDone()
		f.e.setEndpoint(ep)
	}
	f.e.podChanged("prod", "web")
	st := f.flush()
	if st.endpoints != 2 {
		t.Fatalf("the recompute covered %d endpoints, want 2", st.endpoints)
	}
	if got := changedRows(before, f.rows()); len(got) != 0 || st.written != 0 || st.deleted != 0 {
		t.Fatalf("a recompute of unchanged inputs wrote %v", got)
	}
}

// TestBadVersionKeepsLastGood: a new version of a policy the agent cannot
// apply changes nothing and is named as a problem; the version before
// stays in force, and other policies keep working.
func TestBadVersionKeepsLastGood(t *testing.T) {
	f := incrementalFixture(t)
	before := f.rows()
	bad := namedPolicy(netpol("prod", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
		{Ports: []networkingv1.NetworkPolicyPort{portRange(9000, 8000)}}}}), "web")
	r := Translate(bad)
	f.e.setRule(r.Name, r)
	f.flush()
	if got := changedRows(before, f.rows()); len(got) != 0 {
		t.Fatalf("a bad version changed %v", got)
	}
	if p := f.e.problems()["prod/web"]; !strings.Contains(p, "prod/web") || !strings.Contains(p, "endPort 8000") {
		t.Fatalf("problem of prod/web is %q, want it to name the policy and the endPort", p)
	}
	if !f.connects("prod/client", "prod/web", ProtoTCP, 8080) || f.connects("prod/client", "prod/web", ProtoTCP, 9000) {
		t.Fatal("the last good version of prod/web is not in force")
	}
	// Deleting the policy stops its enforcement.
	f.e.setRule("prod/web", nil)
	f.flush()
	if !f.connects("prod/client", "prod/web", ProtoTCP, 9000) {
		t.Fatal("prod/web is still enforced after its deletion")
	}
	if _, ok := f.e.problems()["prod/web"]; ok {
		t.Fatal("a deleted policy is still named as a problem")
	}
}

// TestTranslateErrors: what the agent cannot apply is an error naming the
// policy and the part that is wrong.
func TestTranslateErrors(t *testing.T) {
	sctp := corev1.Protocol("ICMP")
	named := intstr.FromString("http")
	endPort := int32(90)
	cases := []struct {
		name string
		spec networkingv1.NetworkPolicySpec
		want string
	}{
		{"selector", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: "Near", Values: []string{"x"}}}}}, "podSelector"},
		{"peer selector", networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}})}, "ingress[0]: peer 0: namespaceSelector"},
		{"endPort below port", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{portRange(100, 90)}}}}, "endPort 90"},
		{"endPort with a named port", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Port: &named, EndPort: &endPort}}}}}, "endPort needs a numeric port"},
		{"protocol", networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &sctp}}}}}, `protocol "ICMP"`},
		{"policy type", networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Sideways"}}, "policyTypes"},
		{"ipBlock cidr", networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.300/8"}})}, "ipBlock cidr"},
		{"ipBlock except outside", networkingv1.NetworkPolicySpec{Ingress: from(networkingv1.NetworkPolicyPeer{
			IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"192.168.0.0/16"}}})}, "not strictly inside"},
		{"empty peer", networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{}}}}}, "egress[0]: peer 0"},
	}
	for _, c := range cases {
		r := Translate(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "p"}, Spec: c.spec})
		if !strings.HasPrefix(r.Error, "NetworkPolicy prod/p: ") || !strings.Contains(r.Error, c.want) {
			t.Errorf("%s: error %q, want one naming prod/p and %q", c.name, r.Error, c.want)
		}
	}
	ok := Translate(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "p"}})
	if ok.Error != "" || !ok.Ingress || ok.Egress {
		t.Errorf("an empty spec: %+v, want ingress isolation and no error", ok)
	}
}

// TestIdentityOfOtherKindSelectsNothing: reserved identities are no pod's:
// a namespaceSelector {} does not select them.
func TestIdentityOfOtherKindSelectsNothing(t *testing.T) {
	f := newFixture(t)
	f.apply(netpol("prod", web, networkingv1.NetworkPolicySpec{Ingress: from(nss(all))}))
	for _, id := range []identity.NumericIdentity{identity.World, identity.RemoteNode, identity.Health} {
		if f.allows(1, Ingress, id, ProtoTCP, 80) {
			t.Errorf("identity %d is allowed by namespaceSelector {}", id)
		}
	}
}

// prefixID is the ID of the prefix p in the table "policy-prefixes".
func (f *fixture) prefixID(p string) identity.NumericIdentity {
	f.t.Helper()
	row, _, ok := f.prefixes.Get(f.db.ReadTxn(), PrefixByPrefix.Query(netip.MustParsePrefix(p)))
	if !ok {
		f.t.Fatalf("no row for prefix %s", p)
	}
	return row.ID
}

// TestPrefixesIncremental: a prefix that another policy's ipBlock brings
// in splits the blocks that hold it: their endpoints get the new prefix's
// entries (only those), verdicts stay, and the tables equal those
// computed from scratch; when it goes, its entries go.
func TestPrefixesIncremental(t *testing.T) {
	webEgress := namedPolicy(netpol("prod", web, networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.1.0.0/16", "10.1.0.2/32")}}}}), "web-egress")
	dbIngress := namedPolicy(netpol("prod", db, networkingv1.NetworkPolicySpec{
		Ingress: from(block("10.1.0.0/24"))}), "db-ingress")
	f := newFixture(t)
	f.apply(webEgress)
	before := f.rows()
	f.apply(dbIngress)
	slash24, dbAddr := f.prefixID("10.1.0.0/24"), f.prefixID("10.1.0.2/32")
	// db's block selects web's except too: the address is inside the /24.
	wantWritten := []string{
		"written " + EntryKey{EndpointID: 1, Direction: Egress, Identity: slash24}.String(),
		"written " + EntryKey{EndpointID: 2, Direction: Ingress, Identity: slash24}.String(),
		"written " + EntryKey{EndpointID: 2, Direction: Ingress, Identity: dbAddr}.String(),
		"written " + EntryKey{EndpointID: 2, Direction: Ingress, Identity: identity.Host}.String(),
		"written enforcement 2",
	}
	got := changedRows(before, f.rows())
	slices.Sort(got)
	slices.Sort(wantWritten)
	if !slices.Equal(got, wantWritten) {
		t.Fatalf("a new policy with prefix 10.1.0.0/24 changed\n%v\nwant\n%v", got, wantWritten)
	}
	for _, c := range []check{
		{"prod/web", "prod/client", ProtoTCP, 80, true}, {"prod/web", "dev/web", ProtoTCP, 80, true},
		{"prod/web", "prod/db", ProtoTCP, 80, false}, {"prod/client", "prod/db", ProtoTCP, 80, true},
	} {
		if got := f.connects(c.from, c.to, c.proto, c.port); got != c.want {
			t.Errorf("%s -> %s: allowed %v, want %v", c.from, c.to, got, c.want)
		}
	}
	scratch := newFixture(t)
	scratch.apply(webEgress, dbIngress)
	if a, b := slices.Sorted(maps.Keys(f.rows())), slices.Sorted(maps.Keys(scratch.rows())); !slices.Equal(a, b) {
		t.Fatalf("incremental rows\n%v\nfrom scratch\n%v", a, b)
	}

	f.e.setRule("prod/db-ingress", nil)
	f.e.revision++
	f.flush()
	for p := range f.prefixes.All(f.db.ReadTxn()) {
		if p.ID == slash24 {
			t.Fatal("prefix 10.1.0.0/24 outlived the policy that named it")
		}
	}
	if got := changedRows(before, f.rows()); len(got) != 1 || got[0] != "written enforcement 2" {
		t.Fatalf("deleting the policy left %v changed, want only db's enforcement row", got)
	}
}

// TestChangeWritesBeforeItDeletes: a policy change inserts an endpoint's
// new entries before it deletes its old ones, so that the maps, written
// in the table's revision order, get the new allows before the old ones
// go: traffic that both versions allow passes throughout, also when the
// agent is killed half way (TestNetworkPolicyRestart/kill-during-convergence).
func TestChangeWritesBeforeItDeletes(t *testing.T) {
	f := incrementalFixture(t)
	wtxn := f.db.WriteTxn(f.entries)
	changes, err := f.entries.Changes(wtxn)
	if err != nil {
		t.Fatal(err)
	}
	wtxn.Commit()
	seq, _ := changes.Next(f.db.ReadTxn())
	for range seq {
	}
	// web's policy is replaced, in one flush, by one that takes clients
	// on 8081 instead of 8080.
	f.e.setRule("prod/web", nil)
	f.apply(namedPolicy(netpol("prod", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
		{From: []networkingv1.NetworkPolicyPeer{podSel(client)}, Ports: []networkingv1.NetworkPolicyPort{port("", 8081)}}}}), "web-2"))
	var order []string
	firstDelete := -1
	seq, _ = changes.Next(f.db.ReadTxn())
	for ch := range seq {
		if ch.Object.Key.EndpointID != 1 {
			continue
		}
		what := "written "
		if ch.Deleted {
			what = "deleted "
			if firstDelete < 0 {
				firstDelete = len(order)
			}
		} else if firstDelete >= 0 {
			t.Errorf("entry %s written after %s", ch.Object.Key, order[firstDelete])
		}
		order = append(order, what+ch.Object.Key.String())
	}
	if firstDelete < 0 || firstDelete == len(order) {
		t.Fatalf("the change did not both write and delete entries of web's endpoint: %v", order)
	}
	t.Logf("changes in revision order: %v", order)
}

// TestPrefixesWrittenLongerFirst: the prefixes of a batch are written
// longer first, so that policy-maps, which writes in revision order, has
// an except in the trie before its cidr (a trie filling up then refuses
// the cidr, not the except), and deleted shorter first.
func TestPrefixesWrittenLongerFirst(t *testing.T) {
	pol := namedPolicy(netpol("prod", web, networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			block("10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.2.0.0/16"), block("192.168.0.0/16", "192.168.1.1/32")}}}}), "blocks")
	f := newFixture(t)
	f.apply(pol)
	var order []string
	type row struct {
		p   netip.Prefix
		rev statedb.Revision
	}
	var rows []row
	for p, rev := range f.prefixes.All(f.db.ReadTxn()) {
		rows = append(rows, row{p.Prefix, rev})
	}
	slices.SortFunc(rows, func(a, b row) int { return int(a.rev) - int(b.rev) })
	for _, r := range rows {
		order = append(order, r.p.String())
	}
	for i := 1; i < len(rows); i++ {
		if rows[i].p.Bits() > rows[i-1].p.Bits() {
			t.Fatalf("prefixes in revision order %v: %s after the shorter %s", order, rows[i].p, rows[i-1].p)
		}
	}
	if len(rows) != 6 {
		t.Fatalf("prefixes %v, want 6", order)
	}
}
