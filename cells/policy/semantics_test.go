package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/endpointmanager"
	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// The test cluster: two namespaces and five pods, two of them on this node.
var (
	namespaces = map[string]map[string]string{
		"prod": {"team": "a", "env": "prod"},
		"dev":  {"team": "b"},
	}
	pods = []testPod{
		{name: "prod/web", labels: map[string]string{"app": "web"}, id: 1001, ep: 1, addr: addr("10.1.0.1"),
			ports: []namedPort{{"http", ProtoTCP, 8080}, {"dns", ProtoUDP, 53}}},
		{name: "prod/db", labels: map[string]string{"app": "db"}, id: 1002, ep: 2, addr: addr("10.1.0.2"),
			ports: []namedPort{{"pg", ProtoTCP, 5432}}},
		{name: "prod/client", labels: map[string]string{"app": "client"}, id: 1003, addr: addr("10.1.0.3")},
		{name: "dev/client", labels: map[string]string{"app": "client"}, id: 1004, addr: addr("10.1.1.4")},
		{name: "dev/web", labels: map[string]string{"app": "web"}, id: 1005, addr: addr("10.1.1.5")},
		{name: "dev/db", labels: map[string]string{"app": "db"}, id: 1006, addr: addr("10.1.1.6"),
			ports: []namedPort{{"pg", ProtoTCP, 15432}}},
	}
	// Parties that are no pod: their identity and address.
	others = map[string]testPod{
		"world":   {id: identity.World, addr: addr("192.0.2.10")},
		"outside": {id: identity.World, addr: addr("192.0.2.20")},
		"world6":  {id: identity.World, addr: addr("2001:db8::10")},
		"host":    {id: identity.Host, addr: addr("10.0.0.1")},
	}
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

type testPod struct {
	name   string
	labels map[string]string
	id     identity.NumericIdentity
	addr   netip.Addr
	ep     uint16 // 0: not on this node
	ports  []namedPort
}

// podIdentityLabels is a pod's identity label set as cells/identity makes
// it (Allocator.PodLabels with the default filter).
func podIdentityLabels(namespace string, podLabels, nsLabels map[string]string) labels.Labels {
	var ls []labels.Label
	for k, v := range podLabels {
		ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: k, Value: v})
	}
	for k, v := range nsLabels {
		ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: idcell.NamespaceLabelsPrefix + k, Value: v})
	}
	ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: idcell.NamespaceLabel, Value: namespace})
	return labels.New(ls...)
}

type fixture struct {
	t           testing.TB
	db          *statedb.DB
	entries     statedb.RWTable[*Entry]
	enforcement statedb.RWTable[*Enforcement]
	prefixes    statedb.RWTable[*Prefix]
	e           *engine
}

func newFixture(t testing.TB) *fixture {
	db := statedb.New()
	entries, err := NewEntriesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	enforcement, err := NewEnforcementTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ports := map[string][]namedPort{}
	byKey := map[string][]namedPort{}
	for _, p := range pods {
		ports[p.name] = p.ports
		ns, _ := splitName(p.name)
		// As podPorts keys them: the identity label set without the
		// namespace's labels.
		key := podIdentityLabels(ns, p.labels, nil).String()
		byKey[key] = append(byKey[key], p.ports...)
		byKey[""] = append(byKey[""], p.ports...)
	}
	prefixes, err := NewPrefixesTable(db)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, db: db, entries: entries, enforcement: enforcement, prefixes: prefixes,
		e: newEngine(entries, enforcement, prefixes, func(ns, name string) []namedPort { return ports[ns+"/"+name] },
			func(key string) []namedPort { return byKey[key] })}
	for id, name := range identity.Reserved() {
		f.e.addIdentity(id, labels.New(labels.Label{Source: labels.SourceReserved, Key: name}))
	}
	for _, p := range pods {
		ns, name := splitName(p.name)
		f.e.addIdentity(p.id, podIdentityLabels(ns, p.labels, namespaces[ns]))
		if p.ep != 0 {
			f.e.setEndpoint(&endpointmanager.Endpoint{ID: p.ep, PodNamespace: ns, PodName: name, Labels: p.labels, Identity: p.id})
		}
	}
	f.flush()
	return f
}

func splitName(s string) (string, string) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:]
		}
	}
	return "", s
}

func (f *fixture) flush() flushStats {
	f.t.Helper()
	wtxn := f.db.WriteTxn(f.entries, f.enforcement, f.prefixes)
	st, err := f.e.flush(wtxn)
	if err != nil {
		f.t.Fatal(err)
	}
	wtxn.Commit()
	return st
}

func (f *fixture) apply(nps ...*networkingv1.NetworkPolicy) {
	f.t.Helper()
	for _, np := range nps {
		r := Translate(np)
		if r.Error != "" {
			f.t.Fatalf("policy %s: %s", r.Name, r.Error)
		}
		f.e.setRule(r.Name, r)
	}
	f.e.revision++ // as the job does, from the rules table's revision
	f.flush()
}

// allows says whether an endpoint's direction allows traffic with peer
// to proto/port, reading the tables as the datapath does (entry.go).
func (f *fixture) allows(ep uint16, dir Direction, peer identity.NumericIdentity, proto uint8, port uint16) bool {
	return f.allowsAt(ep, dir, peer, netip.Addr{}, proto, port)
}

// allowsAt is allows for a peer at addr (invalid: not known), which also
// matches the entries of the ID of the longest prefix holding addr in
// the table "policy-prefixes".
func (f *fixture) allowsAt(ep uint16, dir Direction, peer identity.NumericIdentity, addr netip.Addr, proto uint8, port uint16) bool {
	txn := f.db.ReadTxn()
	enf, _, ok := f.enforcement.Get(txn, EnforcementByEndpoint.Query(ep))
	if !ok {
		f.t.Fatalf("endpoint %d has no enforcement row", ep)
	}
	if (dir == Ingress && !enf.Ingress) || (dir == Egress && !enf.Egress) {
		return true
	}
	prefixID, longest := identity.Unknown, -1
	for p := range f.prefixes.All(txn) {
		if addr.IsValid() && p.Prefix.Contains(addr) && p.Prefix.Bits() > longest {
			prefixID, longest = p.ID, p.Prefix.Bits()
		}
	}
	for e := range f.entries.List(txn, EntryByEndpoint.Query(ep)) {
		if e.Key.Direction == dir && (e.Key.Allows(peer, proto, port) || (longest >= 0 && e.Key.Allows(prefixID, proto, port))) {
			return true
		}
	}
	return false
}

// connects says whether a connection from one party to another is allowed:
// the source's egress and the destination's ingress must both allow it.
func (f *fixture) connects(from, to string, proto uint8, port uint16) bool {
	src, dst := testParty(f.t, from), testParty(f.t, to)
	if src.ep != 0 && !f.allowsAt(src.ep, Egress, dst.id, dst.addr, proto, port) {
		return false
	}
	if dst.ep != 0 && !f.allowsAt(dst.ep, Ingress, src.id, src.addr, proto, port) {
		return false
	}
	return true
}

func testParty(t testing.TB, name string) testPod {
	if p, ok := others[name]; ok {
		return p
	}
	for _, p := range pods {
		if p.name == name {
			return p
		}
	}
	t.Fatalf("no party %q", name)
	return testPod{}
}

// Policy builders, as a user would write the YAML.
func netpol(namespace string, selector map[string]string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	spec.PodSelector = metav1.LabelSelector{MatchLabels: selector}
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("np-%p", &spec)}, Spec: spec}
}

func from(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers}}
}

// block is an ipBlock peer.
func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func podSel(m map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: m}}
}

func nss(m map[string]string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: m}}
}

func port(proto corev1.Protocol, p any) networkingv1.NetworkPolicyPort {
	out := networkingv1.NetworkPolicyPort{}
	if proto != "" {
		out.Protocol = &proto
	}
	switch v := p.(type) {
	case int:
		ip := intstr.FromInt32(int32(v))
		out.Port = &ip
	case string:
		sp := intstr.FromString(v)
		out.Port = &sp
	}
	return out
}

func portRange(from, to int32) networkingv1.NetworkPolicyPort {
	ip := intstr.FromInt32(from)
	return networkingv1.NetworkPolicyPort{Port: &ip, EndPort: &to}
}

var (
	web    = map[string]string{"app": "web"}
	db     = map[string]string{"app": "db"}
	client = map[string]string{"app": "client"}
	all    = map[string]string{}
)

type check struct {
	from, to string
	proto    uint8
	port     uint16
	want     bool
}

const icmp = 1

// TestSemantics checks verdicts written from the Kubernetes NetworkPolicy
// specification (kubernetes.io, "Network Policies"), case by case.
func TestSemantics(t *testing.T) {
	tcp, udp := ProtoTCP, ProtoUDP
	ingressOnly := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	both := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	cases := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		checks   []check
	}{
		{"no policy: not isolated", nil, []check{
			{"prod/client", "prod/web", tcp, 80, true}, {"world", "prod/web", udp, 9, true}, {"prod/web", "world", tcp, 443, true},
		}},
		{"default deny ingress", []*networkingv1.NetworkPolicy{netpol("prod", all, networkingv1.NetworkPolicySpec{PolicyTypes: ingressOnly})}, []check{
			{"prod/client", "prod/web", tcp, 8080, false}, {"prod/web", "prod/db", tcp, 5432, false}, {"world", "prod/web", tcp, 8080, false},
			{"host", "prod/web", tcp, 8080, true}, // the node's probes
			{"prod/web", "world", tcp, 443, true}, // egress is not isolated
		}},
		{"allow all ingress: ingress [{}]", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{}}})}, []check{
			{"world", "prod/web", tcp, 9999, true}, {"dev/client", "prod/web", udp, 53, true}, {"dev/client", "prod/web", icmp, 0, true},
		}},
		{"podSelector alone: pods of the policy's namespace", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(podSel(client))})}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"dev/client", "prod/web", tcp, 8080, false}, {"world", "prod/web", tcp, 8080, false},
			{"prod/db", "prod/web", tcp, 8080, false},
		}},
		{"namespaceSelector alone: all pods of matching namespaces", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(nss(map[string]string{"team": "b"}))})}, []check{
			{"dev/client", "prod/web", tcp, 1, true}, {"dev/web", "prod/web", tcp, 1, true}, {"prod/client", "prod/web", tcp, 1, false},
		}},
		{"both selectors in one peer: AND", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: client}})})}, []check{
			{"dev/client", "prod/web", tcp, 1, true}, {"dev/web", "prod/web", tcp, 1, false}, {"prod/client", "prod/web", tcp, 1, false},
		}},
		{"separate peers: OR", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(nss(map[string]string{"team": "b"}), podSel(client))})}, []check{
			{"dev/client", "prod/web", tcp, 1, true}, {"dev/web", "prod/web", tcp, 1, true}, {"prod/client", "prod/web", tcp, 1, true},
			{"prod/db", "prod/web", tcp, 1, false}, {"world", "prod/web", tcp, 1, false},
		}},
		{"namespaceSelector {}: every pod of the cluster, not the world", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(nss(all))})}, []check{
			{"dev/web", "prod/web", tcp, 1, true}, {"prod/db", "prod/web", tcp, 1, true}, {"world", "prod/web", tcp, 1, false},
		}},
		{"podSelector {}: every pod of the namespace", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(podSel(all))})}, []check{
			{"prod/db", "prod/web", tcp, 1, true}, {"prod/client", "prod/web", tcp, 1, true}, {"dev/client", "prod/web", tcp, 1, false},
		}},
		{"kubernetes.io/metadata.name selects a namespace by name", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: from(nss(map[string]string{"kubernetes.io/metadata.name": "dev"}))})}, []check{
			{"dev/web", "prod/web", tcp, 1, true}, {"prod/client", "prod/web", tcp, 1, false},
		}},
		{"numeric port, TCP by default", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{port("", 8080)}}}})}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"prod/client", "prod/web", tcp, 8081, false},
			{"prod/client", "prod/web", udp, 8080, false}, {"prod/client", "prod/web", icmp, 0, false},
		}},
		{"protocol without port: every port of it", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, nil)}}}})}, []check{
			{"prod/client", "prod/web", udp, 53, true}, {"prod/client", "prod/web", udp, 9999, true}, {"prod/client", "prod/web", tcp, 53, false},
		}},
		{"endPort range", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{portRange(8000, 8100)}}}})}, []check{
			{"prod/client", "prod/web", tcp, 8000, true}, {"prod/client", "prod/web", tcp, 8100, true},
			{"prod/client", "prod/web", tcp, 8101, false}, {"prod/client", "prod/web", tcp, 7999, false},
		}},
		{"named port on the destination pod", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{port("", "http"), port(corev1.ProtocolUDP, "dns")}}}})}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"prod/client", "prod/web", udp, 53, true},
			{"prod/client", "prod/web", tcp, 53, false}, {"prod/client", "prod/web", tcp, 8081, false},
		}},
		{"policies are additive", []*networkingv1.NetworkPolicy{
			netpol("prod", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{podSel(client)}, Ports: []networkingv1.NetworkPolicyPort{port("", 8080)}}}}),
			netpol("prod", web, networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{nss(map[string]string{"team": "b"})}, Ports: []networkingv1.NetworkPolicyPort{port("", 9090)}}}}),
		}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"prod/client", "prod/web", tcp, 9090, false},
			{"dev/web", "prod/web", tcp, 9090, true}, {"dev/web", "prod/web", tcp, 8080, false},
		}},
		{"policyTypes default: Egress too when there are egress rules", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{podSel(db)}}}})}, []check{
			{"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "world", tcp, 443, false}, {"prod/web", "dev/web", tcp, 80, false},
			{"prod/client", "prod/web", tcp, 8080, false}, // Ingress is a type too, with no rule
		}},
		{"policyTypes Egress only: ingress not isolated", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: egressOnly,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{podSel(db)}}}})}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "world", tcp, 443, false},
		}},
		{"a connection needs the source's egress and the destination's ingress", []*networkingv1.NetworkPolicy{
			netpol("prod", web, networkingv1.NetworkPolicySpec{PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{podSel(db)}}}}),
			netpol("prod", db, networkingv1.NetworkPolicySpec{Ingress: from(podSel(client))}),
		}, []check{
			{"prod/web", "prod/db", tcp, 5432, false}, {"prod/client", "prod/db", tcp, 5432, true},
		}},
		{"egress named port resolves on the peer pod", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: both,
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{podSel(db)},
				Ports: []networkingv1.NetworkPolicyPort{port("", "pg")}}}})}, []check{
			{"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "prod/db", tcp, 5433, false}, {"host", "prod/web", tcp, 8080, true},
		}},
		{"egress named port resolves on each peer pod, on this node or not", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: egressOnly,
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: db},
				NamespaceSelector: &metav1.LabelSelector{}}}, Ports: []networkingv1.NetworkPolicyPort{port("", "pg")}}}})}, []check{
			{"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "prod/db", tcp, 15432, false},
			{"prod/web", "dev/db", tcp, 15432, true}, {"prod/web", "dev/db", tcp, 5432, false},
			{"prod/web", "dev/web", tcp, 15432, false},
		}},
		{"egress named port to everyone: any pod's port of that name", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: egressOnly,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{Ports: []networkingv1.NetworkPolicyPort{port("", "pg")}}}})}, []check{
			{"prod/web", "dev/db", tcp, 15432, true}, {"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "prod/db", tcp, 5433, false},
		}},
		{"ipBlock of every address: everyone, pods included", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: ingressOnly,
			Ingress:     from(block("0.0.0.0/0"))})}, []check{
			{"world", "prod/web", tcp, 1, true}, {"prod/client", "prod/web", tcp, 1, true}, {"dev/web", "prod/web", udp, 53, true},
			{"world6", "prod/web", tcp, 1, false}, // ::/0 is another block
		}},
		{"ipBlock with except, ingress from outside the cluster", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{block("192.0.2.0/24", "192.0.2.10/32")},
				Ports: []networkingv1.NetworkPolicyPort{port("", 8080)}}}})}, []check{
			{"outside", "prod/web", tcp, 8080, true}, {"outside", "prod/web", tcp, 80, false},
			{"world", "prod/web", tcp, 8080, false}, {"prod/client", "prod/web", tcp, 8080, false},
		}},
		{"egress to a server's pod address /32", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: egressOnly,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.1.0.2/32")}}}})}, []check{
			{"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "prod/db", udp, 53, true},
			{"prod/web", "prod/client", tcp, 80, false}, {"prod/web", "world", tcp, 443, false},
		}},
		{"egress except clause with a pod's address", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			PolicyTypes: egressOnly,
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.1.0.0/16", "10.1.0.2/32")}}}})}, []check{
			{"prod/web", "prod/db", tcp, 5432, false}, {"prod/web", "prod/client", tcp, 80, true}, {"prod/web", "dev/web", tcp, 80, true},
			{"prod/web", "world", tcp, 443, false},
		}},
		{"an address in one policy's except and another's cidr is allowed", []*networkingv1.NetworkPolicy{
			netpol("prod", web, networkingv1.NetworkPolicySpec{PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.1.0.0/16", "10.1.0.2/32")}}}}),
			netpol("prod", web, networkingv1.NetworkPolicySpec{PolicyTypes: egressOnly,
				Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{block("10.1.0.2/32")}}}}),
		}, []check{
			{"prod/web", "prod/db", tcp, 5432, true}, {"prod/web", "prod/client", tcp, 80, true}, {"prod/web", "world", tcp, 443, false},
		}},
		{"the same except in two rules, ports apart", []*networkingv1.NetworkPolicy{netpol("prod", web, networkingv1.NetworkPolicySpec{
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{block("10.1.0.0/16", "10.1.0.3/32")}, Ports: []networkingv1.NetworkPolicyPort{port("", 80)}},
				{From: []networkingv1.NetworkPolicyPeer{block("10.1.0.0/24")}, Ports: []networkingv1.NetworkPolicyPort{port("", 443)}},
			}})}, []check{
			{"prod/client", "prod/web", tcp, 80, false}, {"prod/client", "prod/web", tcp, 443, true},
			{"dev/client", "prod/web", tcp, 80, true}, {"dev/client", "prod/web", tcp, 443, false},
		}},
		{"the policy applies only to the pods it selects", []*networkingv1.NetworkPolicy{netpol("prod", db, networkingv1.NetworkPolicySpec{PolicyTypes: both})}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"prod/web", "world", tcp, 443, true},
			{"prod/client", "prod/db", tcp, 5432, false}, {"prod/db", "world", tcp, 443, false},
		}},
		{"a policy of another namespace does not apply", []*networkingv1.NetworkPolicy{netpol("dev", all, networkingv1.NetworkPolicySpec{PolicyTypes: both})}, []check{
			{"prod/client", "prod/web", tcp, 8080, true}, {"prod/web", "world", tcp, 443, true},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			f.apply(c.policies...)
			for _, ch := range c.checks {
				if got := f.connects(ch.from, ch.to, ch.proto, ch.port); got != ch.want {
					t.Errorf("%s -> %s %s/%d: allowed %v, want %v", ch.from, ch.to, ProtocolName(ch.proto), ch.port, got, ch.want)
				}
			}
		})
	}
}
