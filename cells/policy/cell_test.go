package policy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

const nodeName = "node1"

type testAgent struct {
	t           *testing.T
	cs          *k8sclient.Fake
	db          *statedb.DB
	identities  statedb.RWTable[*idcell.Identity]
	endpoints   statedb.RWTable[*endpointmanager.Endpoint]
	entries     statedb.Table[*policy.Entry]
	enforcement statedb.Table[*policy.Enforcement]
	health      statedb.Table[*health.Status]
}

// start runs the policy cell against the fake clientset, with the
// identities and endpoints tables written by the test as the identity and
// endpoint-manager cells would.
func start(t *testing.T, objects ...runtime.Object) *testAgent {
	a, h := newAgent(t, nil, objects...)
	celltest.Start(t, h)
	return a
}

func newAgent(t *testing.T, extra cell.Cell, objects ...runtime.Object) (*testAgent, *hive.Hive) {
	a := &testAgent{t: t}
	if extra == nil {
		extra = cell.Group()
	}
	h := celltest.New(
		policy.Cell,
		extra,
		k8sclienttest.Cell(objects...),
		cell.Provide(func() daemon.NodeName { return nodeName }),
		cell.Provide(idcell.NewTable, statedb.RWTable[*idcell.Identity].ToTable),
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Invoke(func(cs *k8sclient.Fake, db *statedb.DB, ids statedb.RWTable[*idcell.Identity], eps statedb.RWTable[*endpointmanager.Endpoint],
			entries statedb.Table[*policy.Entry], enf statedb.Table[*policy.Enforcement], hs statedb.Table[*health.Status]) {
			a.cs, a.db, a.identities, a.endpoints, a.entries, a.enforcement, a.health = cs, db, ids, eps, entries, enf, hs
		}),
	)
	return a, h
}

func (a *testAgent) addIdentity(id identity.NumericIdentity, namespace string, podLabels, nsLabels map[string]string) {
	var ls []labels.Label
	for k, v := range podLabels {
		ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: k, Value: v})
	}
	for k, v := range nsLabels {
		ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: idcell.NamespaceLabelsPrefix + k, Value: v})
	}
	ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: idcell.NamespaceLabel, Value: namespace})
	txn := a.db.WriteTxn(a.identities)
	if _, _, err := a.identities.Insert(txn, &idcell.Identity{ID: id, Labels: labels.New(ls...), Kind: idcell.KindLocal}); err != nil {
		a.t.Fatal(err)
	}
	txn.Commit()
}

func (a *testAgent) deleteIdentity(id identity.NumericIdentity) {
	txn := a.db.WriteTxn(a.identities)
	if _, _, err := a.identities.Delete(txn, &idcell.Identity{ID: id}); err != nil {
		a.t.Fatal(err)
	}
	txn.Commit()
}

func (a *testAgent) addEndpoint(ep *endpointmanager.Endpoint) {
	txn := a.db.WriteTxn(a.endpoints)
	if _, _, err := a.endpoints.Insert(txn, ep); err != nil {
		a.t.Fatal(err)
	}
	txn.Commit()
}

// entries are an endpoint's entries as "direction identity proto port-end policies".
func (a *testAgent) entriesOf(ep uint16) []string {
	var out []string
	for e := range a.entries.List(a.db.ReadTxn(), policy.EntryByEndpoint.Query(ep)) {
		k := e.Key
		out = append(out, fmt.Sprintf("%s %d %d %d-%d %s", k.Direction, k.Identity, k.Protocol, k.Port, k.EndPort, strings.Join(e.Policies, ",")))
	}
	slices.Sort(out)
	return out
}

func (a *testAgent) waitEntries(ep uint16, want ...string) {
	a.t.Helper()
	slices.Sort(want)
	var got []string
	celltest.Eventually(a.t, fmt.Sprintf("entries of endpoint %d: %q", ep, want), func() (bool, string) {
		got = a.entriesOf(ep)
		return slices.Equal(got, want), fmt.Sprintf("%q", got)
	})
}

func (a *testAgent) enforcementOf(ep uint16) (in, out bool) {
	e, _, ok := a.enforcement.Get(a.db.ReadTxn(), policy.EnforcementByEndpoint.Query(ep))
	return ok && e.Ingress, ok && e.Egress
}

func (a *testAgent) healthOf() *health.Status {
	for st := range a.health.All(a.db.ReadTxn()) {
		if len(st.Path) == 2 && st.Path[0] == "policy" && st.Path[1] == "job-compute-policy" {
			return st
		}
	}
	return nil
}

func netpol(name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: name}, Spec: spec}
}

func ingressFrom(peer networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicySpec {
	return networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{peer}, Ports: ports}},
	}
}

func portOf(p intstr.IntOrString) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: &p}
}

// TestCell: NetworkPolicies from the API server become entries and
// enforcement of the local endpoints they select; identities coming and
// going (a namespace's labels changing) change them; bad policies are
// named in health and change nothing else; deleting a policy ends it.
func TestCell(t *testing.T) {
	webPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
	}
	a := start(t, webPod)
	prod, dev := map[string]string{"team": "a"}, map[string]string{"team": "b"}
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, prod)
	a.addIdentity(1003, "prod", map[string]string{"app": "client"}, prod)
	a.addIdentity(1004, "dev", map[string]string{"app": "client"}, dev)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 1001})
	a.addEndpoint(&endpointmanager.Endpoint{ID: 2, PodNamespace: "prod", PodName: "other", Labels: map[string]string{"app": "other"}, Identity: 1002})

	celltest.Eventually(t, "enforcement rows of both endpoints, not isolated", func() (bool, string) {
		in1, out1 := a.enforcementOf(1)
		_, _, ok := a.enforcement.Get(a.db.ReadTxn(), policy.EnforcementByEndpoint.Query(2))
		return ok && !in1 && !out1, fmt.Sprintf("endpoint 1 isolated ingress %v egress %v; endpoint 2's row %v", in1, out1, ok)
	})

	// A named port resolves on the pod's container ports.
	client := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}
	if err := k8sclienttest.Create(a.cs, netpol("from-client", ingressFrom(client, portOf(intstr.FromString("http"))))); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 8080-0 prod/from-client")
	if in, out := a.enforcementOf(1); !in || out {
		t.Fatalf("endpoint 1 isolated ingress %v egress %v, want ingress only", in, out)
	}
	if got := a.entriesOf(2); len(got) != 0 {
		t.Fatalf("endpoint 2, which no policy selects, has entries %q", got)
	}

	// A namespace's labels change: its pods get new identities (the
	// endpoint manager's doing), and a namespaceSelector follows them.
	teamC := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "c"}}}
	if err := k8sclienttest.Create(a.cs, netpol("from-team-c", ingressFrom(teamC, portOf(intstr.FromInt32(9090))))); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "from-team-c applied", func() (bool, string) {
		h := a.healthOf()
		return h != nil && strings.HasPrefix(h.Message, "2 NetworkPolicies"), fmt.Sprintf("%+v", h)
	})
	a.deleteIdentity(1004)
	a.addIdentity(1005, "dev", map[string]string{"app": "client"}, map[string]string{"team": "c"})
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 8080-0 prod/from-client", "ingress 1005 6 9090-0 prod/from-team-c")
	// And back: the identity of team c goes, and its entry with it.
	a.deleteIdentity(1005)
	a.addIdentity(1004, "dev", map[string]string{"app": "client"}, dev)
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 8080-0 prod/from-client")
	a.deleteIdentity(1004)
	a.addIdentity(1005, "dev", map[string]string{"app": "client"}, map[string]string{"team": "c"})
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 8080-0 prod/from-client", "ingress 1005 6 9090-0 prod/from-team-c")

	// Bad policies are named in health and change nothing else.
	end := int32(80)
	bad := ingressFrom(client, networkingv1.NetworkPolicyPort{Port: ptr(intstr.FromInt32(90)), EndPort: &end})
	if err := k8sclienttest.Create(a.cs, netpol("bad-range", bad)); err != nil {
		t.Fatal(err)
	}
	if err := k8sclienttest.Create(a.cs, netpol("no-such-port", ingressFrom(client, portOf(intstr.FromString("grpc"))))); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "health naming prod/bad-range and prod/no-such-port", func() (bool, string) {
		h := a.healthOf()
		return h != nil && h.Level == cell.StatusDegraded &&
			strings.Contains(h.Error, "NetworkPolicy prod/bad-range: ingress[0]: ports[0]: endPort 80") &&
			strings.Contains(h.Error, "NetworkPolicy prod/no-such-port: named port grpc/TCP is on none of the 1 local pods it selects"), fmt.Sprintf("%+v", h)
	})
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 8080-0 prod/from-client", "ingress 1005 6 9090-0 prod/from-team-c")

	// Deleting policies ends their enforcement, and their problems.
	for _, name := range []string{"from-client", "bad-range", "no-such-port"} {
		if err := a.cs.NetworkingV1().NetworkPolicies("prod").Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1005 6 9090-0 prod/from-team-c")
	celltest.Eventually(t, "health OK again", func() (bool, string) {
		h := a.healthOf()
		return h != nil && h.Level == cell.StatusOK, fmt.Sprintf("%+v", h)
	})
	if err := a.cs.NetworkingV1().NetworkPolicies("prod").Delete(t.Context(), "from-team-c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1)
	if in, out := a.enforcementOf(1); in || out {
		t.Fatalf("endpoint 1 still isolated (ingress %v, egress %v) with no policy", in, out)
	}
}

func ptr[T any](v T) *T { return &v }

// TestEgressNamedPortRemotePod: an egress named port resolves on the
// container ports of the peer's pods on other nodes, read from the Pods of
// the API; a change of those ports, or of the pod's labels, follows.
func TestEgressNamedPortRemotePod(t *testing.T) {
	dbPod := func(port int32, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "db-0", Labels: labels},
			Spec: corev1.PodSpec{NodeName: "node2", Containers: []corev1.Container{{Name: "pg",
				Ports: []corev1.ContainerPort{{Name: "pg", ContainerPort: port, Protocol: corev1.ProtocolTCP}}}}},
		}
	}
	dbLabels := map[string]string{"app": "db"}
	a := start(t, dbPod(5432, dbLabels))
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, nil)
	a.addIdentity(1002, "prod", dbLabels, nil)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 1001})
	toDB := networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
		Egress: []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: dbLabels}}},
			Ports: []networkingv1.NetworkPolicyPort{portOf(intstr.FromString("pg"))},
		}},
	}
	if err := k8sclienttest.Create(a.cs, netpol("to-db", toDB)); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1, "egress 1002 6 5432-0 prod/to-db")

	// The remote pod's port changes: the entry follows.
	if _, err := a.cs.CoreV1().Pods("prod").Update(t.Context(), dbPod(6432, dbLabels), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1, "egress 1002 6 6432-0 prod/to-db")

	// A second pod of the identity, with another number for the name:
	// both numbers, for that identity only.
	other := dbPod(7432, dbLabels)
	other.Name = "db-1"
	if _, err := a.cs.CoreV1().Pods("prod").Create(t.Context(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1, "egress 1002 6 6432-0 prod/to-db", "egress 1002 6 7432-0 prod/to-db")

	// db-1's labels change (it has another identity, which the policy
	// does not select): its port goes from identity 1002's.
	other.Labels = map[string]string{"app": "db", "tier": "replica"}
	if _, err := a.cs.CoreV1().Pods("prod").Update(t.Context(), other, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1, "egress 1002 6 6432-0 prod/to-db")

	// The pod goes: no port of that name, no entry.
	if err := a.cs.CoreV1().Pods("prod").Delete(t.Context(), "db-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1)
}

// TestIdentityNumberReusedWithOtherLabels: a number that goes and comes
// back with another label set before compute-policy reads the identities
// table (statedb then gives the job only the re-insert; local mode gives
// a released number to the next label set at once), and a number whose
// labels are edited in place (crd, kvstore), select by the new labels:
// the allow of the old label set no longer covers the number.
func TestIdentityNumberReusedWithOtherLabels(t *testing.T) {
	a := start(t)
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, nil)
	a.addIdentity(1003, "prod", map[string]string{"app": "client"}, nil)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 1001})
	client := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}
	if err := k8sclienttest.Create(a.cs, netpol("from-client", ingressFrom(client, portOf(intstr.FromInt32(80))))); err != nil {
		t.Fatal(err)
	}
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 80-0 prod/from-client")

	// 1003 released and given to app=evil in one transaction.
	txn := a.db.WriteTxn(a.identities)
	a.identities.Delete(txn, &idcell.Identity{ID: 1003})
	evil := labels.New(
		labels.Label{Source: labels.SourceK8s, Key: "app", Value: "evil"},
		labels.Label{Source: labels.SourceK8s, Key: idcell.NamespaceLabel, Value: "prod"})
	a.identities.Insert(txn, &idcell.Identity{ID: 1003, Labels: evil, Kind: idcell.KindLocal})
	txn.Commit()
	// A later client identity: once its entry is in, the job has read
	// the change of 1003 too.
	a.addIdentity(1004, "prod", map[string]string{"app": "client", "v": "2"}, nil)
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1004 6 80-0 prod/from-client")

	// 1004's labels edited in place to app=evil, and 1003's to
	// app=client: the selection follows.
	a.addIdentity(1004, "prod", map[string]string{"app": "evil", "v": "2"}, nil)
	a.addIdentity(1003, "prod", map[string]string{"app": "client"}, nil)
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 80-0 prod/from-client")
}
