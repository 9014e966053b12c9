package identity

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/kubeapitest"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/polltest"
)

type fakeKV struct {
	kvstore.Client
	enabled bool
}

func (f fakeKV) Enabled() bool { return f.enabled }

type fakeClientset struct {
	k8sclient.Clientset
	embedded bool
}

func (f fakeClientset) Embedded() bool { return f.embedded }

func TestResolveMode(t *testing.T) {
	real, embedded := fakeClientset{}, fakeClientset{embedded: true}
	for _, c := range []struct {
		flag    string
		kv      bool
		cs      k8sclient.Clientset
		want    Mode
		wantErr string
	}{
		{flag: "auto", kv: true, cs: real, want: ModeKVStore},
		{flag: "auto", cs: real, want: ModeCRD},
		{flag: "auto", cs: embedded, want: ModeLocal},
		{flag: "auto", want: ModeLocal},
		{flag: "kvstore", kv: true, cs: real, want: ModeKVStore},
		{flag: "kvstore", cs: real, wantErr: "--identity-allocation-mode=kvstore needs a kvstore: set --kvstore"},
		{flag: "crd", cs: real, want: ModeCRD},
		{flag: "crd", kv: true, cs: real, want: ModeCRD},
		{flag: "crd", cs: embedded, wantErr: "--identity-allocation-mode=crd needs a real Kubernetes API server"},
		{flag: "local", cs: real, want: ModeLocal},
		{flag: "local", kv: true, wantErr: "--identity-allocation-mode=local conflicts with --kvstore"},
		{flag: "etcd", wantErr: `invalid --identity-allocation-mode "etcd"`},
	} {
		got, err := resolveMode(c.flag, fakeKV{enabled: c.kv}, c.cs)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("resolveMode(%q, kvstore %v, %v) = %v, %v; want error %q", c.flag, c.kv, c.cs, got, err, c.wantErr)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("resolveMode(%q, kvstore %v, %v) = %v, %v; want %v", c.flag, c.kv, c.cs, got, err, c.want)
		}
	}
}

// Racing nodes try one label set's numbers in the same order.
func TestCandidateSequence(t *testing.T) {
	key := web("default").String()
	seen := map[identity.NumericIdentity]bool{}
	for i := range 16 {
		n := candidate(key, i)
		if !n.IsCluster() || n != candidate(key, i) {
			t.Fatalf("candidate %d = %v: want the same cluster number each time", i, n)
		}
		seen[n] = true
	}
	if len(seen) < 14 {
		t.Fatalf("16 candidates, %d distinct", len(seen))
	}
	if candidate(key, 0) == candidate(web("other").String(), 0) {
		t.Fatal("two label sets start at one number")
	}
}

// crdNode is the identity cell of one node in crd mode.
type crdNode struct {
	a  *Allocator
	hs statedb.Table[*health.Status]
}

// crdCluster is a kube-apiserver with deploy/rbac.yaml applied, and a
// kubeconfig of the agent's service account.
type crdCluster struct {
	kas        *kubeapitest.Server
	admin      *k8sapi.Client
	kubeconfig string
}

func startCRDCluster(t *testing.T) *crdCluster {
	t.Helper()
	kas, kubeconfig := kubeapitest.StartForAgent(t, func() string { return etcdtest.Start(t).Endpoint() }, filepath.Join("..", "..", "deploy", "rbac.yaml"))
	c := &crdCluster{kas: kas, kubeconfig: kubeconfig}
	admin, err := k8sapi.NewClient(kas.Config(kubeapitest.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	c.admin = admin
	return c
}

// startNode runs the identity cell of node against the cluster, as the
// agent's service account, with the default --identity-allocation-mode.
func (c *crdCluster) startNode(t *testing.T, node string, cfg ...func(*Config)) *crdNode {
	t.Helper()
	n := &crdNode{}
	h := celltest.New(daemon.Cell, kvstore.Cell, k8sclient.Cell, Cell,
		cell.Invoke(func(a *Allocator, hs statedb.Table[*health.Status]) { n.a, n.hs = a, hs }))
	dir := t.TempDir()
	hive.AddConfigOverride(h, func(cfg *daemon.Config) {
		cfg.StateDir, cfg.RunDir, cfg.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), node
	})
	hive.AddConfigOverride(h, func(cfg *k8sclient.Config) { cfg.K8sMode, cfg.Kubeconfig = "kubeconfig", c.kubeconfig })
	for _, f := range cfg {
		hive.AddConfigOverride(h, f)
	}
	celltest.Start(t, h)
	if n.a.Mode() != ModeCRD {
		t.Fatalf("mode with a real API server and no kvstore = %s, want crd", n.a.Mode())
	}
	return n
}

func (n *crdNode) row(id identity.NumericIdentity) (*Identity, bool) {
	row, _, found := n.a.tbl.Get(n.a.db.ReadTxn(), ByID.Query(id))
	return row, found
}

// Two nodes with no kvstore: the agent installs the CRDs; one label set
// gets one number on both, also when they race to allocate it; each node's
// table has every identity object, with source crd; bad objects are named
// in health and ignored.
func TestCRDAllocation(t *testing.T) {
	c := startCRDCluster(t)
	n1, n2 := c.startNode(t, "node-1"), c.startNode(t, "node-2")
	ctx := ctxT(t)
	if err := n1.a.WaitSynced(ctx); err != nil {
		t.Fatalf("identities not synced (CRDs not installed?): %v", err)
	}

	id, err := n1.a.Allocate(ctx, web("default"))
	if err != nil || !id.IsCluster() {
		t.Fatalf("Allocate on node-1 = %v, %v; want a cluster identity", id, err)
	}
	obj, err := c.admin.GetIdentity(ctx, id.String())
	if err != nil || strings.Join(obj.Spec.Labels, ";") != web("default").String() {
		t.Fatalf("CelliumIdentity %s = %+v, %v; want the label set", id, obj, err)
	}
	celltest.Eventually(t, "node-2 knows the identity from its object", func() (bool, string) {
		row, found := n2.row(id)
		return found && row.Source == SourceCRD && row.Labels.Equal(web("default")), fmt.Sprintf("found %v: %+v", found, row)
	})
	if got, ok := n2.a.Lookup(web("default")); !ok || got != id {
		t.Fatalf("Lookup on node-2 = %v, %v; want %v", got, ok, id)
	}
	if got, err := n2.a.Allocate(ctx, web("default")); err != nil || got != id {
		t.Fatalf("Allocate on node-2 = %v, %v; want node-1's %v", got, err, id)
	}
	if row, _ := n2.row(id); row.Refs != 1 || row.Source != SourceCRD {
		t.Fatalf("node-2's row %+v: want 1 ref, source crd", row)
	}

	// Racing allocations of a new label set on both nodes meet on one
	// number.
	racing := labels.New(labels.Label{Source: "k8s", Key: "app", Value: "racing"})
	var wg sync.WaitGroup
	got := make([]identity.NumericIdentity, 8)
	for i := range got {
		n := []*crdNode{n1, n2}[i%2]
		wg.Go(func() {
			var err error
			if got[i], err = n.a.Allocate(ctx, racing); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, g := range got {
		if g != got[0] || !g.IsCluster() {
			t.Fatalf("racing allocations got %v: want one cluster number", got)
		}
	}
	list, err := c.admin.ListIdentities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("%d identity objects after two label sets: %+v", len(list.Items), list.Items)
	}

	// Bad objects: the schema lets these in, the watch refuses them.
	for _, bad := range []struct{ name, label, why string }{
		{"400", "=garbage", "not a label set"},
		{"401", "k8s:a;b=c", "not in canonical form"},
		{"7", "k8s:app=host", "outside the cluster range"},
		{"0402", "k8s:app=alias", "canonical form"},
	} {
		if _, err := c.admin.CreateIdentity(ctx, &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: bad.name}, Spec: k8sapi.IdentitySpec{Labels: []string{bad.label}}}); err != nil {
			t.Fatal(err)
		}
		celltest.Eventually(t, "node-2's health names "+bad.name, func() (bool, string) {
			s, _, found := n2.hs.Get(n2.a.db.ReadTxn(), health.StatusID.Query("identity.crd-identities"))
			return found && s.Level == cell.StatusDegraded && strings.Contains(s.Error, bad.name+": ") && strings.Contains(s.Error, bad.why), fmt.Sprintf("found %v: %+v", found, s)
		})
	}
	for _, n := range []identity.NumericIdentity{400, 401} {
		if row, found := n2.row(n); found {
			t.Errorf("bad object %d has a row: %+v", n, row)
		}
	}
	if row, _ := n2.row(7); row.Kind != KindReserved {
		t.Errorf("a CelliumIdentity named 7 replaced the reserved row: %+v", row)
	}
	if err := c.admin.DeleteIdentity(ctx, "400", ""); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "a deleted bad object leaves health", func() (bool, string) {
		s, _, _ := n2.hs.Get(n2.a.db.ReadTxn(), health.StatusID.Query("identity.crd-identities"))
		return !strings.Contains(s.Error, "400: "), fmt.Sprintf("%+v", s)
	})

	// An object nobody here uses goes from the table when deleted.
	other := labels.New(labels.Label{Source: "k8s", Key: "app", Value: "other"})
	if _, err := c.admin.CreateIdentity(ctx, &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "500"}, Spec: k8sapi.IdentitySpec{Labels: other.Strings()}}); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "500 known on node-1", func() (bool, string) {
		n, ok := n1.a.Lookup(other)
		return ok && n == 500, fmt.Sprintf("lookup: %v, %v", n, ok)
	})
	if err := c.admin.DeleteIdentity(ctx, "500", ""); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "500 gone on node-1", func() (bool, string) { row, found := n1.row(500); return !found, fmt.Sprintf("%+v", row) })
	if err := c.admin.DeleteIdentity(ctx, "500", ""); !apierrors.IsNotFound(err) {
		t.Fatalf("delete again: %v", err)
	}
}

// The collector: one agent at a time (the Lease's holder); an identity no
// endpoint object and no local endpoint uses for two rounds is deleted,
// one used again in between is kept; the endpoint objects of a node that
// has gone for two rounds are deleted; an identity in use that is deleted
// all the same is written back by its user.
func TestCRDGC(t *testing.T) {
	c := startCRDCluster(t)
	noTimer := func(cfg *Config) { cfg.IdentityGCInterval = time.Hour }
	n1, n2 := c.startNode(t, "node-1", noTimer), c.startNode(t, "node-2", noTimer)
	ctx := ctxT(t)
	if err := n1.a.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node-1", "node-2"} {
		if _, err := c.kas.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	set := func(app string) labels.Labels { return labels.New(labels.Label{Source: "k8s", Key: "app", Value: app}) }
	used, err := n1.a.Allocate(ctx, set("used"))
	if err != nil {
		t.Fatal(err)
	}
	create := func(n int, app string) {
		t.Helper()
		if _, err := c.admin.CreateIdentity(ctx, &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(n)}, Spec: k8sapi.IdentitySpec{Labels: set(app).Strings()}}); err != nil {
			t.Fatal(err)
		}
	}
	endpoint := func(name, node string, id int) {
		t.Helper()
		if _, err := c.admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Status: k8sapi.EndpointStatus{Identity: uint32(id), NodeName: node}}); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(n int) bool {
		_, err := c.admin.GetIdentity(ctx, strconv.Itoa(n))
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	}
	create(1001, "unused")
	create(1002, "used-again")
	create(1003, "remote")
	create(1004, "ghost")
	endpoint("remote", "node-2", 1003)
	endpoint("ghost", "node-gone", 1004)
	round := func(n *crdNode) {
		t.Helper()
		if err := n.a.gcRoundCRD(ctx); err != nil {
			t.Fatal(err)
		}
	}

	round(n1)
	round(n2) // not the Lease's holder: does nothing
	lease, err := c.admin.Leases(gcLeaseNamespace).Get(ctx, gcLeaseName, metav1.GetOptions{})
	if err != nil || *lease.Spec.HolderIdentity != "node-1" {
		t.Fatalf("Lease %s after node-1's then node-2's round: %+v, %v; want node-1 holding it", gcLeaseName, lease, err)
	}
	for _, n := range []int{1001, 1002, 1003, 1004} {
		if !exists(n) {
			t.Fatalf("identity %d deleted after one round", n)
		}
	}
	endpoint("again", "node-2", 1002)
	round(n2)
	round(n1)
	if exists(1001) {
		t.Error("identity 1001, unused for two rounds, not deleted")
	}
	for _, n := range []int{int(used), 1002, 1003} {
		if !exists(n) {
			t.Errorf("identity %d, in use, deleted", n)
		}
	}
	list, err := c.admin.ListEndpoints(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range list.Items {
		if ep.Name == "ghost" {
			t.Error("the endpoint object of a node gone for two rounds not deleted")
		}
	}
	// Its identity was unused in this round, the first time: collected in
	// the next.
	if !exists(1004) {
		t.Error("identity 1004 deleted in the round its last user went")
	}
	round(n1)
	if exists(1004) {
		t.Error("identity 1004 not deleted the round after its last user went")
	}

	// An identity in use deleted all the same: its user writes it back.
	if err := c.admin.DeleteIdentity(ctx, used.String(), ""); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the identity in use written back", func() (bool, string) {
		obj, err := c.admin.GetIdentity(ctx, used.String())
		if err != nil {
			return false, err.Error()
		}
		return strings.Join(obj.Spec.Labels, ";") == set("used").String(), fmt.Sprint(obj.Spec.Labels)
	})
}

// The API server stopped and started again under running agents: a label
// set the table knows still gets its number; a new one fails (its endpoint
// gets init meanwhile) until the API server is back, then gets a number,
// and the agents' watches resume, with no restart; meanwhile the watch's
// health is Degraded and the backend's state says so.
func TestCRDAPIServerRestart(t *testing.T) {
	c := startCRDCluster(t)
	n1, n2 := c.startNode(t, "node-1"), c.startNode(t, "node-2")
	// A stop and a start of the API server take longer than ctxT's.
	ctx, cancelAll := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancelAll()
	id, err := n1.a.Allocate(ctx, web("default"))
	if err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "node-2 knows the identity", func() (bool, string) {
		n, ok := n2.a.Lookup(web("default"))
		return ok && n == id, fmt.Sprintf("lookup: %v, %v", n, ok)
	})

	c.kas.Stop()
	if got, err := n2.a.Allocate(ctx, web("default")); err != nil || got != id {
		t.Fatalf("Allocate of a known label set with the API server away = %v, %v; want %v", got, err, id)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	_, err = n2.a.Allocate(short, web("new"))
	cancel()
	if err == nil {
		t.Fatal("Allocate of a new label set with the API server away succeeded")
	}
	t.Logf("as expected, with the API server away: %v", err)
	watchHealth := func(n *crdNode, level cell.Level) func() (bool, string) {
		return func() (bool, string) {
			s, _, found := n.hs.Get(n.a.db.ReadTxn(), health.StatusID.Query("identity.job-watch-crd-identities"))
			want := stateWatching
			if level != cell.StatusOK {
				want = stateWatchFailing
			}
			state := n.a.Backend().State
			return found && s.Level == level && state == want, fmt.Sprintf("health found %v: %+v; state %s", found, s, state)
		}
	}
	celltest.Eventually(t, "node-1's watch Degraded and its state "+stateWatchFailing+" with the API server away", watchHealth(n1, cell.StatusDegraded))

	c.kas.Restart(t)
	var fresh identity.NumericIdentity
	polltest.Until(t, "the new label set allocated once the API server is back", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		fresh, err = n2.a.Allocate(short, web("new"))
		return err == nil, fmt.Sprint(err)
	})
	celltest.Eventually(t, "node-1's watch resumed: it knows the new identity", func() (bool, string) {
		n, ok := n1.a.Lookup(web("new"))
		return ok && n == fresh, fmt.Sprintf("lookup: %v, %v", n, ok)
	})
	celltest.Eventually(t, "node-1's watch OK and its state "+stateWatching+" again", watchHealth(n1, cell.StatusOK))
}
