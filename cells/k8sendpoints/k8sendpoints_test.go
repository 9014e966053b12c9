package k8sendpoints

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/kubeapitest"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/polltest"
)

type cluster struct {
	kas        *kubeapitest.Server
	admin      *k8sapi.Client
	kubeconfig string
}

func startCluster(t *testing.T) *cluster { return startClusterTB(t) }

func startClusterTB(t testing.TB) *cluster {
	t.Helper()
	kas, kubeconfig := kubeapitest.StartForAgent(t, func() string { return etcdtest.Start(t).Endpoint() }, filepath.Join("..", "..", "deploy", "rbac.yaml"))
	c := &cluster{kas: kas, kubeconfig: kubeconfig}
	admin, err := k8sapi.NewClient(kas.Config(kubeapitest.AdminToken))
	if err != nil {
		t.Fatal(err)
	}
	c.admin = admin
	kas.CreateDefaultServiceAccount(t)
	return c
}

// node is one agent's cells that matter here: identities, this cell, and
// the endpoints and nodes tables, which the test writes as the endpoint
// manager and the nodes cell would.
type node struct {
	name  string
	h     *hive.Hive
	db    *statedb.DB
	ids   *idcell.Allocator
	eps   statedb.RWTable[*endpointmanager.Endpoint]
	nodes statedb.RWTable[*nodes.Node]
	tbl   statedb.Table[*Endpoint]
	hs    statedb.Table[*health.Status]
	// metrics are the cell's.
	metrics *endpointMetrics
}

// otherNodes are the nodes every node's nodes table has.
var otherNodes = map[string]*nodes.Node{
	"node-1": {Name: "node-1", Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.1")}}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}}},
	"node-2": {Name: "node-2", Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.2")}}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")}}},
	// node-3 runs no agent: nothing deletes the objects naming it.
	"node-3": {Name: "node-3", Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.3")}}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.3.0.0/24")}}},
}

func (c *cluster) start(t testing.TB, name, dir string) *node {
	t.Helper()
	return c.startWith(t, name, dir, nil)
}

// startWith is start, calling init in the transaction that fills the
// nodes table (to register an initializer, as the nodes cell does).
func (c *cluster) startWith(t testing.TB, name, dir string, init func(statedb.WriteTxn, statedb.RWTable[*nodes.Node])) *node {
	t.Helper()
	n := &node{name: name}
	h := celltest.New(daemon.Cell, kvstore.Cell, k8sclient.Cell, idcell.Cell, Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable,
			nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable),
		cell.Invoke(func(db *statedb.DB, ids *idcell.Allocator, eps statedb.RWTable[*endpointmanager.Endpoint],
			nt statedb.RWTable[*nodes.Node], tbl statedb.Table[*Endpoint], hs statedb.Table[*health.Status], m *endpointMetrics) {
			n.db, n.ids, n.eps, n.nodes, n.tbl, n.hs, n.metrics = db, ids, eps, nt, tbl, hs, m
			txn := db.WriteTxn(nt)
			if init != nil {
				init(txn, nt)
			}
			for _, o := range otherNodes {
				row := *o
				row.Local = row.Name == name
				nt.Insert(txn, &row)
			}
			txn.Commit()
		}))
	hive.AddConfigOverride(h, func(cfg *daemon.Config) {
		cfg.StateDir, cfg.RunDir, cfg.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), name
	})
	hive.AddConfigOverride(h, func(cfg *k8sclient.Config) { cfg.K8sMode, cfg.Kubeconfig = "kubeconfig", c.kubeconfig })
	n.h = h
	celltest.Start(t, h)
	return n
}

func (n *node) stop(t *testing.T) {
	if err := n.h.Stop(hivetest.Logger(t), context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (n *node) putEndpoint(id uint16, pod string, ip string, ident identity.NumericIdentity) {
	txn := n.db.WriteTxn(n.eps)
	n.eps.Insert(txn, &endpointmanager.Endpoint{ID: id, ContainerID: pod, PodNamespace: "default", PodName: pod,
		IPv4: netip.MustParseAddr(ip), Identity: ident, State: endpointmanager.Ready})
	txn.Commit()
}

func (n *node) deleteEndpoint(id uint16) {
	txn := n.db.WriteTxn(n.eps)
	n.eps.Delete(txn, &endpointmanager.Endpoint{ID: id})
	txn.Commit()
}

func (n *node) health(id string) *health.Status {
	s, _, _ := n.hs.Get(n.db.ReadTxn(), health.StatusID.Query(id))
	return s
}

func (c *cluster) createPod(t testing.TB, name, nodeName string) *corev1.Pod {
	t.Helper()
	pod, err := c.kas.Admin.CoreV1().Pods("default").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "none",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {ContainerPort: 9}}}},
			// A sidecar's named port is the pod's; an init container's,
			// ended before the pod serves, is not.
			InitContainers: []corev1.Container{
				{Name: "setup", Image: "none", Ports: []corev1.ContainerPort{{Name: "setup", ContainerPort: 7000}}},
				{Name: "proxy", Image: "none", RestartPolicy: ptr(corev1.ContainerRestartPolicyAlways),
					Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: 15001, Protocol: corev1.ProtocolTCP}}},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func (c *cluster) get(ctx context.Context, name string) (*k8sapi.CelliumEndpoint, error) {
	list, err := c.admin.ListEndpoints(ctx, "")
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		if list.Items[i].Name == name {
			return &list.Items[i], nil
		}
	}
	return nil, apierrors.NewNotFound(k8sapi.GroupVersion.WithResource(k8sapi.ResourceEndpoints).GroupResource(), name)
}

func ptr[T any](v T) *T { return &v }

// A pod's node writes its CelliumEndpoint (once, and again only on a
// change), the other node learns the pod's identity from it, bad objects
// are named in health and ignored, and the node deletes its objects of
// pods that are gone, also those left from before a restart.
func TestEndpointObjects(t *testing.T) {
	c := startCluster(t)
	dir1 := t.TempDir()
	n1, n2 := c.start(t, "node-1", dir1), c.start(t, "node-2", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	web := labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web"}, labels.Label{Source: "k8s", Key: idcell.NamespaceLabel, Value: "default"})
	id, err := n1.ids.Allocate(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	pod := c.createPod(t, "web-1", "node-1")
	n1.putEndpoint(1, "web-1", "10.1.0.5", id)

	var obj *k8sapi.CelliumEndpoint
	celltest.Eventually(t, "the CelliumEndpoint of web-1", func() (bool, string) {
		obj, err = c.get(ctx, "web-1")
		return err == nil, fmt.Sprint(err)
	})
	want := k8sapi.EndpointStatus{Identity: uint32(id), Addresses: []string{"10.1.0.5"}, NodeName: "node-1", NodeIP: "192.0.2.1",
		NamedPorts: []k8sapi.NamedPort{{Name: "proxy", Port: 15001, Protocol: "TCP"}, {Name: "http", Port: 8080, Protocol: "TCP"}}}
	if !same(obj, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{k8sapi.LabelNode: "node-1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "web-1", UID: pod.UID}}}, Status: want}) {
		t.Fatalf("CelliumEndpoint web-1 = %+v %+v %+v; want status %+v, owned by the pod", obj.Labels, obj.OwnerReferences, obj.Status, want)
	}

	// Counted as its answer arrives, which may be after the object shows.
	client, _ := n1.ids.CRDClient()
	celltest.Eventually(t, "the create counted", func() (bool, string) {
		n := client.RequestCount("create", k8sapi.ResourceEndpoints)
		return n > 0, fmt.Sprint(n, " creates")
	})
	if n := client.RequestCount("create", k8sapi.ResourceEndpoints); n != 1 {
		t.Fatalf("%d creates of CelliumEndpoints for one pod, want 1", n)
	}

	// The other node has the pod with its identity.
	celltest.Eventually(t, "node-2 knows web-1", func() (bool, string) {
		row, _, found := n2.tbl.Get(n2.db.ReadTxn(), ByAddress.Query(netip.MustParseAddr("10.1.0.5")))
		return found && row.Identity == id && row.Node == "node-1" && row.NodeIP == netip.MustParseAddr("192.0.2.1"), fmt.Sprintf("found %v: %+v", found, row)
	})
	// Its own pods are not in its table: they are local.
	if _, _, found := n1.tbl.Get(n1.db.ReadTxn(), ByName.Query("default/web-1")); found {
		t.Fatal("node-1's table has its own pod")
	}

	// A change of the endpoint that the object does not show writes
	// nothing; a change of its identity updates it.
	n1.putEndpoint(1, "web-1", "10.1.0.5", id)
	other, err := n1.ids.Allocate(ctx, labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web2"}))
	if err != nil {
		t.Fatal(err)
	}
	n1.putEndpoint(1, "web-1", "10.1.0.5", other)
	celltest.Eventually(t, "the object updated", func() (bool, string) {
		obj, err = c.get(ctx, "web-1")
		if err != nil {
			return false, err.Error()
		}
		return obj.Status.Identity == uint32(other), fmt.Sprintf("status %+v", obj.Status)
	})
	celltest.Eventually(t, "the update counted", func() (bool, string) {
		n := client.RequestCount("update", k8sapi.ResourceEndpoints)
		return n > 0, fmt.Sprint(n, " updates")
	})
	if creates, updates := client.RequestCount("create", k8sapi.ResourceEndpoints), client.RequestCount("update", k8sapi.ResourceEndpoints); creates != 1 || updates != 1 {
		t.Fatalf("after a change the object does not show and one it does: %d creates, %d updates; want 1 and 1", creates, updates)
	}

	// Bad objects, named in node-2's health and not in its table.
	for _, bad := range []struct {
		name   string
		status k8sapi.EndpointStatus
		why    string
	}{
		{"evil", k8sapi.EndpointStatus{Identity: uint32(id), NodeName: "node-3", Addresses: []string{"10.1.0.9"}}, "not in the pod CIDRs of its node node-3"},
		{"host", k8sapi.EndpointStatus{Identity: uint32(identity.Host), NodeName: "node-3", Addresses: []string{"10.3.0.9"}}, "identity 1"},
		{"alias", k8sapi.EndpointStatus{Identity: uint32(id), NodeName: "node-3", Addresses: []string{"::ffff:10.3.0.1"}}, "canonical form"},
	} {
		if _, err := c.admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: bad.name, Namespace: "default"}, Status: bad.status}); err != nil {
			t.Fatal(err)
		}
		celltest.Eventually(t, "node-2's health names "+bad.name, func() (bool, string) {
			s := n2.health("k8s-endpoints.refused")
			return s != nil && s.Level == cell.StatusDegraded && strings.Contains(s.Error, "default/"+bad.name+": ") && strings.Contains(s.Error, bad.why), fmt.Sprintf("%+v", s)
		})
		if _, _, found := n2.tbl.Get(n2.db.ReadTxn(), ByName.Query("default/"+bad.name)); found {
			t.Errorf("bad object %s in the table", bad.name)
		}
	}

	// A pod gone: its object goes.
	c.createPod(t, "web-2", "node-1")
	n1.putEndpoint(2, "web-2", "10.1.0.6", id)
	celltest.Eventually(t, "web-2's object", func() (bool, string) { _, err := c.get(ctx, "web-2"); return err == nil, fmt.Sprint(err) })
	n1.deleteEndpoint(2)
	// gone waits until pod's object is deleted (why: how) and node-2
	// forgets the pod.
	gone := func(pod, why string) {
		t.Helper()
		celltest.Eventually(t, pod+"'s object deleted"+why, func() (bool, string) {
			_, err := c.get(ctx, pod)
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		celltest.Eventually(t, "node-2 forgets "+pod, func() (bool, string) {
			row, _, found := n2.tbl.Get(n2.db.ReadTxn(), ByName.Query("default/"+pod))
			return !found, fmt.Sprintf("%+v", row)
		})
	}
	gone("web-2", "")

	// Restart node-1 with web-1 gone meanwhile: its stale object is
	// deleted at start, and node-2 forgets the pod.
	n1.stop(t)
	n1 = c.start(t, "node-1", dir1)
	txn := n1.db.WriteTxn(n1.eps)
	done := n1.eps.RegisterInitializer(txn, "test-restore")
	txn.Commit()
	if _, err := c.get(ctx, "web-1"); err != nil {
		t.Fatalf("web-1's object deleted before the endpoints were restored: %v", err)
	}
	txn = n1.db.WriteTxn(n1.eps)
	done(txn)
	txn.Commit()
	gone("web-1", " (stale) at restart")
}

// The API server stopped under a running agent: the watch's health is
// Degraded with the error while it is away, and OK again once it is back,
// with no restart of the agent.
func TestWatchFailureIsDegraded(t *testing.T) {
	c := startCluster(t)
	n := c.start(t, "node-1", t.TempDir())
	const id = "k8s-endpoints.job-watch-endpoints"
	watchHealth := func(level cell.Level) func() (bool, string) {
		return func() (bool, string) {
			s := n.health(id)
			if level == cell.StatusOK {
				return s != nil && s.Level == level && s.Message == "CelliumEndpoint objects listed and watched", fmt.Sprintf("%s: %+v", id, s)
			}
			return s != nil && s.Level == level && s.Error != "", fmt.Sprintf("%s: %+v", id, s)
		}
	}
	polltest.Until(t, "the objects listed and watched", time.Minute, 10*time.Millisecond, watchHealth(cell.StatusOK))

	c.kas.Stop()
	// The informer retries with backoff: more than Eventually's time.
	polltest.Until(t, "the watch Degraded with the API server away", time.Minute, 10*time.Millisecond, watchHealth(cell.StatusDegraded))
	t.Logf("with the API server away: %s", n.health(id).Error)

	c.kas.Restart(t)
	polltest.Until(t, "the watch OK again once the API server is back", time.Minute, 10*time.Millisecond, watchHealth(cell.StatusOK))
}

// With --kvstore=etcd the nodes table is initialized only once etcd has
// listed the node keys (initializer nodes-kvstore). An agent started while
// etcd is unreachable still writes this node's CelliumEndpoints and
// deletes its stale ones (it waited for that listing before, and wrote
// none), and takes other nodes' objects whose node it knows; its table is
// initialized (the ipcache prunes then) only once the nodes table is.
func TestOwnObjectsWhileNodesWaitForKVStore(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var kvListed func(statedb.WriteTxn)
	n := c.startWith(t, "node-1", t.TempDir(), func(txn statedb.WriteTxn, nt statedb.RWTable[*nodes.Node]) {
		// As nodes.Cell with --kvstore=etcd, etcd not answering.
		kvListed = nt.RegisterInitializer(txn, "nodes-kvstore")
	})
	// An object of node-1 with no endpoint (as one left from before a
	// restart, the pod gone while the agent was down). The agent
	// registers the CRDs: made once it runs.
	_, registered := n.ids.CRDClient()
	select {
	case <-registered:
	case <-ctx.Done():
		t.Fatal("CRDs not established")
	}
	celltest.Eventually(t, "the stale object made", func() (bool, string) {
		_, err := c.admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "stale", Namespace: "default",
			Labels: map[string]string{k8sapi.LabelNode: "node-1"}}, Status: k8sapi.EndpointStatus{Identity: uint32(identity.Health), NodeName: "node-1", Addresses: []string{"10.1.0.99"}}})
		return err == nil || apierrors.IsAlreadyExists(err), fmt.Sprint(err)
	})

	web := labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web"}, labels.Label{Source: "k8s", Key: idcell.NamespaceLabel, Value: "default"})
	id, err := n.ids.Allocate(ctx, web)
	if err != nil {
		t.Fatal(err)
	}
	c.createPod(t, "web-1", "node-1")
	n.putEndpoint(1, "web-1", "10.1.0.5", id)
	celltest.Eventually(t, "the CelliumEndpoint of web-1 with the nodes table waiting for etcd", func() (bool, string) {
		_, err := c.get(ctx, "web-1")
		return err == nil, fmt.Sprint(err)
	})
	celltest.Eventually(t, "the stale object deleted with the nodes table waiting for etcd", func() (bool, string) {
		_, err := c.get(ctx, "stale")
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := c.admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "remote", Namespace: "default"},
		Status: k8sapi.EndpointStatus{Identity: uint32(id), NodeName: "node-2", Addresses: []string{"10.2.0.5"}}}); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "node-2's object taken", func() (bool, string) {
		row, _, found := n.tbl.Get(n.db.ReadTxn(), ByName.Query("default/remote"))
		return found, fmt.Sprintf("%+v", row)
	})
	if init, _ := n.tbl.Initialized(n.db.ReadTxn()); init {
		t.Fatal("table k8s-endpoints initialized before the nodes table")
	}
	txn := n.db.WriteTxn(n.nodes)
	kvListed(txn)
	txn.Commit()
	celltest.Eventually(t, "table k8s-endpoints initialized once the nodes table is", func() (bool, string) {
		init, _ := n.tbl.Initialized(n.db.ReadTxn())
		return init, fmt.Sprint(n.tbl.PendingInitializers(n.db.ReadTxn()))
	})
}
