package ipcache_test

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/endpointmanager"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sendpoints"
	"github.com/cellium/cellium/cells/kvstore"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/kubeapitest"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/polltest"
	"github.com/cellium/cellium/pkg/procstat"
)

var (
	remotePods       = flag.Int("remote.pods", 100, "pods per mode and pace in BenchmarkRemotePodIdentity")
	remoteQPS        = flag.Float64("remote.k8s-api-qps", 0, "the agents' --k8s-api-qps in BenchmarkRemotePodIdentity (0: the default)")
	remotePace       = flag.Duration("remote.pace", 100*time.Millisecond, "BenchmarkRemotePodIdentity's paced round: a pod per mode every this long")
	crdStartEps      = flag.Int("crdstart.endpoints", 10_000, "CelliumEndpoint objects in BenchmarkCRDStart")
	crdStartIdents   = flag.Int("crdstart.identities", 1_000, "CelliumIdentity objects in BenchmarkCRDStart")
	crdCreateWorkers = flag.Int("crdstart.workers", 32, "parallel creates of BenchmarkCRDStart's objects")
)

// apiCluster is a real kube-apiserver on a real etcd (its data on a
// tmpfs), the agent's kubeconfig with the DaemonSet's RBAC, and the etcd
// also serving as the kvstore of kvstore mode (under its own prefix).
type apiCluster struct {
	etcd       *etcdtest.Server
	kas        *kubeapitest.Server
	kubeconfig string
}

func startAPICluster(b *testing.B) *apiCluster {
	b.Helper()
	var etcd *etcdtest.Server
	kas, kubeconfig := kubeapitest.StartForAgent(b, func() string {
		etcd = etcdtest.StartInMemory(b)
		return etcd.Endpoint()
	}, filepath.Join("..", "..", "deploy", "rbac.yaml"))
	kas.CreateDefaultServiceAccount(b)
	return &apiCluster{etcd: etcd, kas: kas, kubeconfig: kubeconfig}
}

// benchNodes are the nodes every agent's nodes table has.
var benchNodes = []nodes.Node{
	{Name: "node-1", Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.1")}}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}},
	{Name: "node-2", Spec: nodes.Spec{Addresses: []nodes.Address{{Type: nodes.InternalIP, IP: netip.MustParseAddr("192.0.2.2")}}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}}},
}

// agentNode is one agent's cells from the identity allocator to the
// ipcache's BPF map, with the Kubernetes client and (kvstore mode) the
// kvstore; the endpoint manager's and the nodes' tables are filled by the
// benchmark, as those cells would.
type agentNode struct {
	h   *hive.Hive
	db  *statedb.DB
	eps statedb.RWTable[*endpointmanager.Endpoint]
	ipc statedb.Table[*ipcache.Entry]
	idt statedb.Table[*idalloc.Identity]
	ids *idalloc.Allocator
	// k8s is the table of other nodes' CelliumEndpoints (empty but in
	// crd mode).
	k8s statedb.Table[*k8sendpoints.Endpoint]
}

// startAgent starts node name's agent cells in mode (crd or kvstore), its
// maps under a bpffs directory of its own.
func (c *apiCluster) startAgent(b *testing.B, name, mode string) *agentNode {
	b.Helper()
	n := &agentNode{}
	newAddrs := func(db *statedb.DB) (statedb.RWTable[*devices.NodeAddress], statedb.Table[*devices.NodeAddress], error) {
		tbl, err := statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		return tbl, tbl, err
	}
	n.h = celltest.New(daemon.Cell, bpfmaps.Cell, kvstore.Cell, k8sclient.Cell, idalloc.Cell, k8sendpoints.Cell, ipcache.Cell,
		cell.Module("test-tables", "Endpoints nodes and node addresses filled by the benchmark",
			cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable, newAddrs,
				nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable),
			cell.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpointmanager.Endpoint], nt statedb.RWTable[*nodes.Node],
				ipc statedb.Table[*ipcache.Entry], idt statedb.Table[*idalloc.Identity], ids *idalloc.Allocator,
				k8s statedb.Table[*k8sendpoints.Endpoint]) {
				n.db, n.eps, n.ipc, n.idt, n.ids, n.k8s = db, eps, ipc, idt, ids, k8s
				txn := db.WriteTxn(nt)
				for _, o := range benchNodes {
					row := o
					row.Local = row.Name == name
					nt.Insert(txn, &row)
				}
				txn.Commit()
			}),
		),
	)
	dir := b.TempDir()
	root := bpfmapstest.Root(b)
	hive.AddConfigOverride(n.h, func(cfg *daemon.Config) {
		cfg.StateDir, cfg.RunDir, cfg.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), name
	})
	hive.AddConfigOverride(n.h, func(cfg *bpfmaps.Config) { cfg.BPFRoot = root })
	hive.AddConfigOverride(n.h, func(cfg *k8sclient.Config) {
		cfg.K8sMode, cfg.Kubeconfig = "kubeconfig", c.kubeconfig
		if *remoteQPS > 0 {
			cfg.K8sAPIQPS, cfg.K8sAPIBurst = float32(*remoteQPS), int(2**remoteQPS)
		}
	})
	hive.AddConfigOverride(n.h, func(cfg *idalloc.Config) { cfg.IdentityAllocationMode = mode })
	if mode == "kvstore" {
		hive.AddConfigOverride(n.h, func(cfg *kvstore.Config) {
			cfg.KVStore, cfg.KVStoreOpt, cfg.KVStorePrefix = "etcd", []string{"etcd.address=" + c.etcd.Endpoint()}, "bench"
		})
	}
	celltest.Start(b, n.h)
	return n
}

func (n *agentNode) stop(b *testing.B) {
	if err := n.h.Stop(hivetest.Logger(b), context.Background()); err != nil {
		b.Fatal(err)
	}
}

// waitInMap waits until ip's ipcache row has identity id and is written
// into the BPF map.
func (n *agentNode) waitInMap(ip netip.Addr, id identity.NumericIdentity, timeout time.Duration) error {
	p := netip.PrefixFrom(ip, ip.BitLen())
	deadline := time.After(timeout)
	for {
		e, _, watch, found := n.ipc.GetWatch(n.db.ReadTxn(), ipcache.ByPrefix.Query(p))
		if found && e.Winner().Identity == id && e.Status.Kind == reconciler.StatusKindDone {
			return nil
		}
		select {
		case <-watch:
		case <-deadline:
			return fmt.Errorf("%s not in the ipcache map with identity %d within %s (row %+v)", ip, id, timeout, e)
		}
	}
}

// waitK8sRow waits until n's table of other nodes' CelliumEndpoints has
// ip with identity id.
func (n *agentNode) waitK8sRow(ip netip.Addr, id identity.NumericIdentity, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		row, _, watch, found := n.k8s.GetWatch(n.db.ReadTxn(), k8sendpoints.ByAddress.Query(ip))
		if found && row.Identity == id {
			return nil
		}
		select {
		case <-watch:
		case <-deadline:
			return fmt.Errorf("%s not in the k8s-endpoints table with identity %d within %s", ip, id, timeout)
		}
	}
}

// BenchmarkRemotePodIdentity measures, for each of -remote.pods pods, the
// time from its endpoint on node-1 (the CNI ADD done: the endpoint Ready
// with its identity, of a known label set) until node-2's ipcache BPF map
// has the pod's address with that identity, with identities and
// endpoints in the Kubernetes API (crd mode, CelliumEndpoint objects) and
// in etcd (kvstore mode, ip/v1 keys), the two clusters side by side on
// one kube-apiserver and etcd, a pod in one then a pod in the other, so
// both see the same load; once with the pods -remote.pace apart, once
// back to back. In crd mode also the time until node-2's table of
// CelliumEndpoints has the pod (table_*: the API's part), and node-1's
// requests per pod start. -remote.k8s-api-qps sets the agents'
// --k8s-api-qps (burst twice that) for a look at its rate limit. It prints
//
//	remote-identity-bench mode=kvstore pace=100ms pods=100 p50_ms=... p99_ms=... load=...
//	remote-identity-bench mode=crd pace=100ms pods=100 p50_ms=... p99_ms=... table_p50_ms=... table_p99_ms=... load=...
//	(the same with pace=none)
//	remote-identity-bench mode=crd pods=200 endpoint_creates_per_pod=... endpoint_updates_per_pod=... identity_creates_per_pod=...
func BenchmarkRemotePodIdentity(b *testing.B) {
	c := startAPICluster(b)
	ctx := context.Background()
	modes := []string{"kvstore", "crd"}
	type pair struct{ a, b *agentNode }
	clusters := map[string]pair{}
	ids := map[string]identity.NumericIdentity{}
	for _, mode := range modes {
		p := pair{c.startAgent(b, "node-1", mode), c.startAgent(b, "node-2", mode)}
		clusters[mode] = p
		id, err := p.a.ids.Allocate(ctx, labels.New(labels.Label{Source: "k8s", Key: "app", Value: "bench-" + mode}))
		if err != nil {
			b.Fatal(err)
		}
		ids[mode] = id
	}
	for i := range 2 * *remotePods {
		if _, err := c.kas.Admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%d", i)},
			Spec:       corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	client, _ := clusters["crd"].a.ids.CRDClient()
	count := func(verb, resource string) int { return client.RequestCount(verb, resource) }
	before := map[string]int{}
	for _, k := range []string{"create " + k8sapi.ResourceEndpoints, "update " + k8sapi.ResourceEndpoints, "create " + k8sapi.ResourceIdentities} {
		verb, res, _ := strings.Cut(k, " ")
		before[k] = count(verb, res)
	}

	// Two rounds: pods paced (-remote.pace apart, 10 a second by default:
	// below the agent's --k8s-api-qps of 20), then back to back, where crd
	// mode's creates meet that rate limit once its burst is spent.
	type round struct {
		pace string
		lat  map[string][]time.Duration
	}
	rounds := []round{{pace: remotePace.String(), lat: map[string][]time.Duration{}}, {pace: "none", lat: map[string][]time.Duration{}}}
	b.ResetTimer()
	for r, rd := range rounds {
		t0 := time.Now()
		for i := range *remotePods {
			if r == 0 {
				if wait := time.Until(t0.Add(time.Duration(i) * *remotePace)); wait > 0 {
					time.Sleep(wait) // the workload's pace, not a synchronization
				}
			}
			k := r**remotePods + i
			name := fmt.Sprintf("bench-%d", k)
			ip := netip.AddrFrom4([4]byte{10, 1, byte(1 + k/250), byte(1 + k%250)})
			for _, mode := range modes {
				p := clusters[mode]
				start := time.Now()
				txn := p.a.db.WriteTxn(p.a.eps)
				p.a.eps.Insert(txn, &endpointmanager.Endpoint{ID: uint16(100 + k), ContainerID: name, PodNamespace: "default", PodName: name,
					IPv4: ip, Identity: ids[mode], State: endpointmanager.Ready})
				txn.Commit()
				if mode == "crd" {
					if err := p.b.waitK8sRow(ip, ids[mode], 30*time.Second); err != nil {
						b.Fatalf("pod %s: %v", name, err)
					}
					rd.lat["table"] = append(rd.lat["table"], time.Since(start))
				}
				if err := p.b.waitInMap(ip, ids[mode], 30*time.Second); err != nil {
					b.Fatalf("%s mode, pod %s: %v", mode, name, err)
				}
				rd.lat[mode] = append(rd.lat[mode], time.Since(start))
			}
		}
	}
	b.StopTimer()
	pods := len(rounds) * *remotePods
	// The last create's answer may be counted after node-2 saw the object.
	wantCreates := before["create "+k8sapi.ResourceEndpoints] + pods
	polltest.Until(b, fmt.Sprintf("the API server counting %d creates of %s", wantCreates, k8sapi.ResourceEndpoints), 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		n := count("create", k8sapi.ResourceEndpoints)
		return n >= wantCreates, fmt.Sprint(n, " counted")
	})
	perPod := func(k string) float64 {
		verb, res, _ := strings.Cut(k, " ")
		return float64(count(verb, res)-before[k]) / float64(pods)
	}
	pct := func(l []time.Duration) (p50, p99 float64) {
		slices.Sort(l)
		return float64(l[len(l)/2].Microseconds()) / 1000, float64(l[len(l)*99/100].Microseconds()) / 1000
	}
	for _, rd := range rounds {
		for _, mode := range modes {
			p50, p99 := pct(rd.lat[mode])
			line := fmt.Sprintf("remote-identity-bench mode=%s pace=%s pods=%d p50_ms=%.1f p99_ms=%.1f", mode, rd.pace, len(rd.lat[mode]), p50, p99)
			if mode == "crd" {
				t50, t99 := pct(rd.lat["table"])
				line += fmt.Sprintf(" table_p50_ms=%.1f table_p99_ms=%.1f", t50, t99)
			}
			fmt.Println(line + " load=" + procstat.LoadAverage())
		}
	}
	fmt.Printf("remote-identity-bench mode=crd pods=%d endpoint_creates_per_pod=%.2f endpoint_updates_per_pod=%.2f identity_creates_per_pod=%.2f\n",
		pods, perPod("create "+k8sapi.ResourceEndpoints), perPod("update "+k8sapi.ResourceEndpoints), perPod("create "+k8sapi.ResourceIdentities))
}

// BenchmarkCRDStart puts -crdstart.identities CelliumIdentity and
// -crdstart.endpoints CelliumEndpoint objects (other nodes' pods) in a real
// kube-apiserver, created in parallel before anything is timed
// (setup_*_s), and measures in crd mode an agent's memory: its heap (live,
// after GC) and resident set (after GC and returning free pages to the
// kernel) with the identities and no endpoint, and with every endpoint in
// its ipcache map, the difference per 1,000 endpoints; then a new agent's
// start (empty state and bpffs) until identities and endpoints are listed
// (the tables' initializers done), and until every endpoint's address is
// in its ipcache BPF map, with the API server's CPU seconds from start to
// map and the agent's list and watch requests. It prints
//
//	crd-memory-bench endpoints=... heap_kb_per_1k=... rss_kb_per_1k=... load=...
//	crd-start-bench endpoints=... identities=... setup_identities_s=... setup_endpoints_s=... listed_s=... in_map_s=... apiserver_cpu_s=... lists=... watches=... load=...
func BenchmarkCRDStart(b *testing.B) {
	c := startAPICluster(b)
	nEps, nIDs := *crdStartEps, *crdStartIdents
	cfg := c.kas.Config(kubeapitest.AdminToken)
	cfg.QPS, cfg.Burst = 5000, 10000
	admin, err := k8sapi.NewClient(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()

	// The watcher, up before any object: it registers the CRDs.
	watcher := c.startAgent(b, "node-2", "crd")
	waitListed(b, watcher, 2*time.Minute)

	start := time.Now()
	parallel(b, nIDs, func(i int) error {
		ls := labels.New(labels.Label{Source: "k8s", Key: "app", Value: fmt.Sprintf("app-%d", i)},
			labels.Label{Source: "k8s", Key: idalloc.NamespaceLabel, Value: "default"})
		_, err := admin.CreateIdentity(ctx, &k8sapi.CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(int(identity.MinCluster) + i)},
			Spec: k8sapi.IdentitySpec{Labels: ls.Strings()}})
		return err
	})
	setupIDs := time.Since(start)
	waitCount(b, "identities in node-2's table", 2*time.Minute, nIDs, func() int { return clusterIdentities(watcher) })
	heap0, rss0 := memMark(b)

	start = time.Now()
	parallel(b, nEps, func(i int) error {
		ip := benchEndpointIP(i)
		_, err := admin.CreateEndpoint(ctx, &k8sapi.CelliumEndpoint{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: "default", Labels: map[string]string{k8sapi.LabelNode: benchNodeName(i)}},
			Status: k8sapi.EndpointStatus{Identity: uint32(int(identity.MinCluster) + i%nIDs), Addresses: []string{ip.String()},
				NodeName: benchNodeName(i), NodeIP: fmt.Sprintf("192.168.1.%d", 10+i%100)},
		})
		return err
	})
	setupEps := time.Since(start)
	waitCount(b, "endpoints in node-2's ipcache map", 5*time.Minute, nEps, func() int { return k8sInMap(watcher) })
	heapN, rssN := memMark(b)
	fmt.Printf("crd-memory-bench endpoints=%d heap_kb_per_1k=%.0f rss_kb_per_1k=%.0f load=%s\n", nEps,
		float64(heapN-heap0)/1024/float64(nEps)*1000, float64(rssN-rss0)/1024/float64(nEps)*1000, procstat.LoadAverage())
	watcher.stop(b)

	b.ResetTimer()
	cpu0 := apiServerCPU(b, c.kas)
	start = time.Now()
	n := c.startAgent(b, "node-3", "crd")
	waitListed(b, n, 2*time.Minute)
	listed := time.Since(start)
	waitCount(b, "endpoints in the new agent's ipcache map", 5*time.Minute, nEps, func() int { return k8sInMap(n) })
	inMap := time.Since(start)
	cpu := apiServerCPU(b, c.kas) - cpu0
	b.StopTimer()
	if got := clusterIdentities(n); got != nIDs {
		b.Fatalf("%d identities in the new agent's table, want %d", got, nIDs)
	}
	client, _ := n.ids.CRDClient()
	req := func(verb string) int {
		return client.RequestCount(verb, k8sapi.ResourceEndpoints) + client.RequestCount(verb, k8sapi.ResourceIdentities)
	}
	fmt.Printf("crd-start-bench endpoints=%d identities=%d setup_identities_s=%.1f setup_endpoints_s=%.1f listed_s=%.2f in_map_s=%.2f apiserver_cpu_s=%.2f lists=%d watches=%d load=%s\n",
		nEps, nIDs, setupIDs.Seconds(), setupEps.Seconds(), listed.Seconds(), inMap.Seconds(), cpu.Seconds(), req("list"), req("watch"), procstat.LoadAverage())
}

// benchEndpointIP is the address of BenchmarkCRDStart's endpoint i, out of
// every node's pod CIDR in benchNodes.
func benchEndpointIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(128 + i>>16), byte(i >> 8), byte(i)})
}

// benchNodeName spreads BenchmarkCRDStart's endpoints over 100 nodes.
func benchNodeName(i int) string { return fmt.Sprintf("node-%d", 10+i%100) }

// waitListed waits until n's identities and ipcache tables are
// initialized: every source, the CRDs' two included, listed.
func waitListed(b *testing.B, n *agentNode, timeout time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := tables.WaitInitialized(ctx, n.db, n.idt); err != nil {
		b.Fatalf("identities table not initialized: %v", err)
	}
	if err := tables.WaitInitialized(ctx, n.db, n.ipc); err != nil {
		b.Fatalf("ipcache table not initialized: %v", err)
	}
}

// waitCount polls count until it is want: the tables change at every one
// of thousands of objects, and a scan per change would cost more than the
// work measured.
func waitCount(b *testing.B, what string, timeout time.Duration, want int, count func() int) {
	b.Helper()
	polltest.Until(b, fmt.Sprintf("%s: %d", what, want), timeout, 10*time.Millisecond, func() (bool, string) {
		got := count()
		return got == want, fmt.Sprintf("%d of %d", got, want)
	})
}

// k8sInMap is how many of n's ipcache rows are from CelliumEndpoint
// objects and written into the map.
func k8sInMap(n *agentNode) int {
	done := 0
	for e := range n.ipc.All(n.db.ReadTxn()) {
		if e.Winner().Source == ipcache.SourceK8s && e.Status.Kind == reconciler.StatusKindDone {
			done++
		}
	}
	return done
}

func clusterIdentities(n *agentNode) int {
	c := 0
	for id := range n.idt.All(n.db.ReadTxn()) {
		if id.ID.IsCluster() {
			c++
		}
	}
	return c
}

// parallel runs create(0..n-1) on -crdstart.workers goroutines.
func parallel(b *testing.B, n int, create func(i int) error) {
	b.Helper()
	next := make(chan int)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range *crdCreateWorkers {
		wg.Go(func() {
			for i := range next {
				if err := create(i); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("object %d: %w", i, err))
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d creates failed, the first: %v", len(errs), n, errs[0])
	}
}

// memMark is this process's live heap after a GC, and its resident set
// after the free pages are returned to the kernel.
func memMark(b *testing.B) (heap, rss uint64) {
	b.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := procstat.RSS(0)
	if err != nil {
		b.Fatal(err)
	}
	return ms.HeapAlloc, rss
}

// apiServerCPU is the CPU time kas has spent so far.
func apiServerCPU(b *testing.B, kas *kubeapitest.Server) time.Duration {
	b.Helper()
	d, err := procstat.CPU(kas.PID)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
