package k8sendpoints

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/labels"
)

// TestObjectsLimitedToTheirNode: an object of another node is taken only
// with its addresses in the pod CIDRs of the node it names (a writer of
// the objects, or a node's agent, could otherwise map 8.8.8.8 or another
// node's pod to any identity in every node's ipcache) and with an identity
// of the object's own namespace. The others are refused with a log, named
// in health with the reason, counted, and change nothing else; an object
// whose node or identity is not known yet is pending (not named in health,
// not counted: objects usually arrive before their identity or node) and
// taken once it is, and one whose node loses the pod CIDR goes.
func TestObjectsLimitedToTheirNode(t *testing.T) {
	c := startCluster(t)
	n := c.start(t, "node-2", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := n.metrics

	web, err := n.ids.Allocate(ctx, labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web"}, labels.Label{Source: "k8s", Key: idcell.NamespaceLabel, Value: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	prod, err := n.ids.Allocate(ctx, labels.New(labels.Label{Source: "k8s", Key: "app", Value: "db"}, labels.Label{Source: "k8s", Key: idcell.NamespaceLabel, Value: "prod"}))
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string, id identity.NumericIdentity, node, addr string) {
		t.Helper()
		if _, err := c.admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Status: k8sapi.EndpointStatus{Identity: uint32(id), NodeName: node, Addresses: []string{addr}}}); err != nil {
			t.Fatal(err)
		}
	}
	taken := func(name string) func() (bool, string) {
		return func() (bool, string) {
			row, _, found := n.tbl.Get(n.db.ReadTxn(), ByName.Query("default/"+name))
			return found, fmt.Sprintf("%s: %+v", name, row)
		}
	}
	refused := func(name, why string) {
		t.Helper()
		celltest.Eventually(t, "health names "+name, func() (bool, string) {
			s := n.health("k8s-endpoints.refused")
			return s != nil && s.Level == cell.StatusDegraded && strings.Contains(s.Error, "default/"+name+": "+why), fmt.Sprintf("%+v", s)
		})
		if ok, row := taken(name)(); ok {
			t.Errorf("refused object in the table: %s", row)
		}
	}

	create("good", web, "node-1", "10.1.0.8")
	celltest.Eventually(t, "the good object taken", taken("good"))

	create("outside", web, "node-1", "8.8.8.8")
	refused("outside", "address 8.8.8.8 is not in the pod CIDRs of its node node-1 (10.1.0.0/24)")
	create("other-cidr", web, "node-1", "10.2.0.9")
	refused("other-cidr", "address 10.2.0.9 is not in the pod CIDRs of its node node-1 (10.1.0.0/24)")
	// Not known yet: pending. The informer hands the objects over in
	// order, so once wrong-ns, made after them, is refused, they have
	// been checked.
	create("late-node", web, "node-4", "10.4.0.5")
	const lateID = 60000
	create("late-identity", lateID, "node-1", "10.1.0.20")
	create("wrong-ns", prod, "node-1", "10.1.0.7")
	refused("wrong-ns", fmt.Sprintf(`identity %d is of namespace "prod", not the object's namespace "default"`, prod))
	for _, name := range []string{"late-node", "late-identity"} {
		if s := n.health("k8s-endpoints.refused"); strings.Contains(s.Error, "default/"+name) {
			t.Errorf("pending object %s named in health: %s", name, s.Error)
		}
		if ok, row := taken(name)(); ok {
			t.Errorf("pending object in the table: %s", row)
		}
	}
	for _, reason := range []string{"node", "identity"} {
		if got := testutil.ToFloat64(m.refused.WithLabelValues(reason)); got != 0 {
			t.Errorf("cellium_k8s_endpoints_refused_total{reason=%s} = %v with objects only pending, want 0", reason, got)
		}
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("address")); got != 2 {
		t.Errorf("cellium_k8s_endpoints_refused_total{reason=address} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("namespace")); got != 1 {
		t.Errorf("cellium_k8s_endpoints_refused_total{reason=namespace} = %v, want 1", got)
	}
	// Nothing else changed: the good object's row is there as it was.
	if row, _, found := n.tbl.Get(n.db.ReadTxn(), ByAddress.Query(netip.MustParseAddr("10.1.0.8"))); !found || row.Name != "good" || row.Identity != web {
		t.Errorf("the good object's row after the refusals: %v %+v", found, row)
	}

	// Taken once the node is known.
	txn := n.db.WriteTxn(n.nodes)
	n.nodes.Insert(txn, &nodes.Node{Name: "node-4", Spec: nodes.Spec{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.4.0.0/24")}}})
	txn.Commit()
	celltest.Eventually(t, "late-node taken once node-4 is known", taken("late-node"))

	// Taken once its identity's object is made.
	if _, err := c.admin.CreateIdentity(ctx, &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(lateID)},
		Spec: k8sapi.IdentitySpec{Labels: labels.New(labels.Label{Source: "k8s", Key: "app", Value: "late"},
			labels.Label{Source: "k8s", Key: idcell.NamespaceLabel, Value: "default"}).Strings()}}); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "late-identity taken once its identity is known", taken("late-identity"))

	// node-4 loses its pod CIDR: its object goes.
	txn = n.db.WriteTxn(n.nodes)
	n.nodes.Insert(txn, &nodes.Node{Name: "node-4", Spec: nodes.Spec{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.40.0.0/24")}}})
	txn.Commit()
	refused("late-node", "address 10.4.0.5 is not in the pod CIDRs of its node node-4 (10.40.0.0/24)")
}

// An object whose node or identity is still not known once pendingGrace
// has passed is refused as any bad object: named in health with the
// reason and how long it waited, counted under its reason; it is taken
// once its node is known.
func TestNotKnownRefusedAfterGrace(t *testing.T) {
	grace := pendingGrace
	pendingGrace = 200 * time.Millisecond
	t.Cleanup(func() { pendingGrace = grace })
	c := startCluster(t)
	n := c.start(t, "node-2", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	web, err := n.ids.Allocate(ctx, labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web"}, labels.Label{Source: "k8s", Key: idcell.NamespaceLabel, Value: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		name string
		id   identity.NumericIdentity
		node string
		addr string
	}{{"no-node", web, "node-9", "10.9.0.5"}, {"no-identity", 60001, "node-1", "10.1.0.21"}} {
		if _, err := c.admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: o.name, Namespace: "default"},
			Status: k8sapi.EndpointStatus{Identity: uint32(o.id), NodeName: o.node, Addresses: []string{o.addr}}}); err != nil {
			t.Fatal(err)
		}
	}
	celltest.Eventually(t, "health names both once the grace has passed", func() (bool, string) {
		s := n.health("k8s-endpoints.refused")
		return s != nil && s.Level == cell.StatusDegraded &&
			strings.Contains(s.Error, "default/no-node: node node-9 is not known (waited 200ms)") &&
			strings.Contains(s.Error, "default/no-identity: identity 60001 is not known (no CelliumIdentity) (waited 200ms)"), fmt.Sprintf("%+v", s)
	})
	for _, reason := range []string{"node", "identity"} {
		if got := testutil.ToFloat64(n.metrics.refused.WithLabelValues(reason)); got != 1 {
			t.Errorf("cellium_k8s_endpoints_refused_total{reason=%s} = %v, want 1", reason, got)
		}
	}
	txn := n.db.WriteTxn(n.nodes)
	n.nodes.Insert(txn, &nodes.Node{Name: "node-9", Spec: nodes.Spec{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}}})
	txn.Commit()
	celltest.Eventually(t, "no-node taken once node-9 is known", func() (bool, string) {
		row, _, found := n.tbl.Get(n.db.ReadTxn(), ByName.Query("default/no-node"))
		return found, fmt.Sprintf("%+v", row)
	})
	// Checked again on the node's change, no-identity is counted once.
	if got := testutil.ToFloat64(n.metrics.refused.WithLabelValues("identity")); got != 1 {
		t.Errorf("cellium_k8s_endpoints_refused_total{reason=identity} = %v after a recheck, want 1", got)
	}
}
