package endpointmanager_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/logtest"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/pkg/client"
	"github.com/cellium/cellium/pkg/nettest"
)

// node is one run of the agent's endpoint cells over a state directory:
// endpoints are made in the test's (host) network namespace, pods are
// namespaces the test creates.
type node struct {
	mgr      *endpointmanager.Manager
	db       *statedb.DB
	eps      statedb.Table[*endpointmanager.Endpoint]
	ipamTbl  statedb.Table[*ipam.Allocation]
	ipam     *ipam.IPAM
	ids      statedb.Table[*identity.Identity]
	health   statedb.Table[*health.Status]
	client   *client.Client
	logs     *logtest.Recorder
	metrics  *prometheus.Registry
	stateDir string
	// k8s is the fake API server the agent watches pods in.
	k8s  *k8sclient.Fake
	stop func()
}

// testNet is a test's pod ranges, with host blackhole routes over them.
type testNet struct {
	v4, v6 netip.Prefix
	// dir holds the state directories, socket and CNI configuration.
	dir string
}

func newTestNet(t testing.TB) *testNet {
	v4, v6 := nettest.Ranges(t)
	return &testNet{v4: v4, v6: netip.PrefixFrom(v6.Addr(), 120), dir: t.TempDir()}
}

// router is the router address of a pool.
func router(p netip.Prefix) netip.Addr { return p.Addr().Next() }

// nth is the nth pod address of a pool: 1 is the first after the router.
func nth(p netip.Prefix, n int) netip.Addr {
	a := router(p)
	for range n {
		a = a.Next()
	}
	return a
}

type nodeOpts struct {
	cidrs []string
	grace time.Duration
	// k8s are the objects in the fake API server; the node is "node-1".
	k8s []runtime.Object
	// cluster makes the endpoint manager take the fake API server for a
	// real cluster's (Embedded() false).
	cluster bool
	// etcd is the kvstore's address; "" for none (node-local identities).
	etcd string
	// extra are cells besides the endpoint manager's, e.g. live
	// conditions; configure changes the hive's configuration.
	extra     []cell.Cell
	configure func(*hive.Hive)
	// endpoints changes the endpoint manager's configuration.
	endpoints func(*endpointmanager.Config)
}

// start runs the cells over the test's state directory; stop also runs when
// the test ends.
func (tn *testNet) start(t testing.TB, o nodeOpts) *node {
	t.Helper()
	n := &node{logs: logtest.NewRecorder(hivetest.Logger(t).Handler()), stateDir: filepath.Join(tn.dir, "state")}
	var em cell.Cell = endpointmanager.Cell
	if o.cluster {
		em = cell.Decorate(func(cs k8sclient.Clientset) k8sclient.Clientset { return clusterClientset{cs} }, em)
	}
	h := celltest.New(daemon.Cell, metrics.Cell, api.Cell, ipam.Cell, kvstore.Cell, identity.Cell, em, k8sclienttest.Cell(o.k8s...),
		cell.Group(o.extra...),
		cell.Invoke(func(m *endpointmanager.Manager, db *statedb.DB, eps statedb.Table[*endpointmanager.Endpoint], tbl statedb.Table[*ipam.Allocation],
			ids statedb.Table[*identity.Identity], hs statedb.Table[*health.Status], cs *k8sclient.Fake, reg *prometheus.Registry, ip *ipam.IPAM) {
			n.mgr, n.db, n.eps, n.ipamTbl, n.ids, n.health, n.k8s, n.metrics, n.ipam = m, db, eps, tbl, ids, hs, cs, reg, ip
		}))
	socket := filepath.Join(tn.dir, "agent.sock")
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = n.stateDir, filepath.Join(tn.dir, "run"), "node-1"
	})
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	hive.AddConfigOverride(h, func(c *endpointmanager.Config) {
		c.CNIConfDir = filepath.Join(tn.dir, "net.d")
		if o.endpoints != nil {
			o.endpoints(c)
		}
	})
	hive.AddConfigOverride(h, func(c *ipam.Config) {
		c.PodCIDR = o.cidrs
		if c.PodCIDR == nil {
			c.PodCIDR = []string{tn.v4.String(), tn.v6.String()}
		}
		c.IPAMLeakGrace = o.grace
		if c.IPAMLeakGrace == 0 {
			c.IPAMLeakGrace = time.Hour
		}
	})
	if o.configure != nil {
		o.configure(h)
	}
	if o.etcd != "" {
		hive.AddConfigOverride(h, func(c *kvstore.Config) {
			c.KVStore, c.KVStoreOpt, c.KVStorePrefix = "etcd", []string{"etcd.address=" + o.etcd}, "em"
		})
	}
	log := slog.New(n.logs)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start: %v", err)
	}
	var once sync.Once
	n.stop = func() {
		once.Do(func() {
			if err := h.Stop(log, context.Background()); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
	}
	t.Cleanup(n.stop)
	n.client = client.New(socket)
	return n
}

// clusterClientset is the fake API server as a real cluster's.
type clusterClientset struct{ k8sclient.Clientset }

func (clusterClientset) Embedded() bool { return false }

// pod is a container: a network namespace and an ID.
type pod struct {
	ns ns.NetNS
	id string
}

func newPod(t testing.TB) pod {
	return pod{ns: nettest.NewNS(t), id: fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())}
}

// req is the creation request a CNI ADD for the pod makes.
func (p pod) req() endpointmanager.CreateRequest {
	return endpointmanager.CreateRequest{ContainerID: p.id, Netns: p.ns.Path(), IfName: "eth0", PodNamespace: "default", PodName: "pod"}
}

func (n *node) create(t *testing.T, p pod) *endpointmanager.Endpoint {
	t.Helper()
	return n.createAs(t, p, p.req().PodName)
}

// createAs creates p's endpoint as the pod podName of the default namespace.
func (n *node) createAs(t *testing.T, p pod, podName string) *endpointmanager.Endpoint {
	t.Helper()
	req := p.req()
	req.PodName = podName
	ep, err := n.mgr.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create endpoint of %s: %v", p.id, err)
	}
	return ep
}

// allocations are the ipam rows other than the routers, as "ip owner state".
func (n *node) allocations() []string {
	var out []string
	for a := range n.ipamTbl.All(n.db.ReadTxn()) {
		if a.State != ipam.Router {
			out = append(out, fmt.Sprintf("%s %s %s", a.IP, a.Owner, a.State))
		}
	}
	return out
}

// endpointIDs are the IDs in the endpoints table.
func (n *node) endpointIDs() []uint16 {
	var out []uint16
	for ep := range n.eps.All(n.db.ReadTxn()) {
		out = append(out, ep.ID)
	}
	return out
}

// waitRestored waits, on the table's watch channel, for the restore.
func (n *node) waitRestored(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := tables.WaitInitialized(ctx, n.db, n.eps); err != nil {
		t.Fatalf("endpoint restore did not finish: %v", err)
	}
}

// waitAllocations waits, on the table's watch channel, until allocations()
// is want.
func (n *node) waitAllocations(t *testing.T, want ...string) {
	t.Helper()
	slices.Sort(want)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, watch := n.ipamTbl.AllWatch(n.db.ReadTxn())
		got := n.allocations()
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("allocations = %q, want %q", got, want)
		}
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

// waitHealth waits, on the table's watch channel, until the health row id
// satisfies ok, and returns it.
func (n *node) waitHealth(t *testing.T, id string, ok func(*health.Status) bool) *health.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		s, _, watch, found := n.health.GetWatch(n.db.ReadTxn(), health.StatusID.Query(id))
		if found && ok(s) || !found && ok(nil) {
			return s
		}
		select {
		case <-watch:
		case <-ctx.Done():
			t.Fatalf("health %s = %+v, not what the test waits for", id, s)
		}
	}
}
