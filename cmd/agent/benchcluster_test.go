package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/kubeapitest"
	"github.com/cellium/cellium/pkg/procstat"
)

var benchClients = flag.Int("bench.clients", 20, "How many agents' list-and-watch of Services and EndpointSlices BenchmarkScaleCluster starts at once (clients in the benchmark's process)")

// BenchmarkScaleCluster is the agent on the path it runs in a cluster: a
// real kube-apiserver (and etcd, its data on a tmpfs) holding
// -bench.services ClusterIP Services, each with an EndpointSlice of one
// endpoint, created through the API before the clock starts (setup_s).
// The agent runs in kubeconfig mode, its listings from the API server, a
// first start and a restart on the same state, as BenchmarkScale measures
// them (see scaleRuns), and the API server's cost of each start: its CPU
// time from the agent's exec until every frontend was written
// (first_apiserver_cpu_s, restart_...) and the bytes it sent the agent
// (first_apiserver_sent_mb, restart_...; the agent talks to it through a
// proxy of the benchmark's that counts them).
//
// Then -bench.clients agents' list-and-watch of both kinds start at once,
// as a DaemonSet's agents do after a rollout, clients in the benchmark's
// own process (Reflectors as the agent's, discarding what they get), once
// for each way of listing (listModes): the time until all have their
// listings (clients_MODE_synced_s), the API server's CPU time over it
// (clients_MODE_apiserver_cpu_s) and the bytes it sent per client; and the
// API server's resident set at the end (apiserver_rss_mb).
//
//	agent-scale-bench mode=cluster setup_s=... services=N first_ready_s=... ... clients=20 clients_watchlist_synced_s=... ...
//
//	go test ./cmd/agent -run '^$' -bench ScaleCluster -benchtime 1x
func BenchmarkScaleCluster(b *testing.B) {
	requireRootB(b)
	kasBin, err := kubeapitest.Binary()
	if err != nil {
		b.Skip(err)
	}
	etcdBin, etcdVersion := clusterEtcd(b)
	n := *benchServices
	const nodeName = "bench-node"
	for range b.N {
		cluster := startScaleCluster(b, etcdBin, kasBin, n, nodeName)
		kas := cluster.kas
		token := kas.Token(b, deployNamespace, "cellium-agent")

		proxy := newCountingProxy(b, kas.URL)
		server := &apiServerMeter{pid: kas.PID, etcdPID: cluster.etcd.PID(), proxy: proxy}
		env := newAgentEnv(b)
		kubeconfig := filepath.Join(env.dir, "kubeconfig")
		proxied := *kas
		proxied.URL = proxy.url
		proxied.WriteKubeconfig(b, kubeconfig, token)
		flags := append(env.runFlags(),
			"--k8s-mode", "kubeconfig", "--kubeconfig", kubeconfig, "--node-name", nodeName, "--ipam", "kubernetes",
			"--lb-service-map-max", strconv.Itoa(2*n+1024),
			"--lb-backend-map-max", strconv.Itoa(n+1024),
		)
		// Whether the server streams lists (it needs an etcd with
		// progress notifications), and how many the agent's two starts
		// streamed of its four listings.
		streams := 0
		if why := watchListUnsupported(b, kas); why == "" {
			streams = 1
		} else {
			fmt.Printf("# agent-scale-bench: the API server does not stream lists: %s\n", why)
		}
		before := watchLists(b, kas)
		load := procstat.LoadAverage()
		agent := scaleRuns(b, env, flags, n, "cluster-", server)
		after := watchLists(b, kas)
		agentStreamed := after["services"] + after["endpointslices"] - before["services"] - before["endpointslices"]
		clients := listWatchClients(b, kas, server, *benchClients)
		fmt.Printf("agent-scale-bench mode=cluster etcd=%s apiserver_streams=%d setup=%s setup_s=%.0f %s agent_streamed_lists=%.0f %s apiserver_rss_mb=%.0f load1=%s\n",
			etcdVersion, streams, cluster.setup, cluster.setupTime.Seconds(), agent, agentStreamed, clients, server.rss(b), load)
	}
}

var (
	benchClusterCache      = flag.String("bench.cluster-cache", "", "A directory where BenchmarkScaleCluster saves etcd's data directory once it has created the objects through the API, and which a later run with the same -bench.services, etcd and kube-apiserver binaries starts from instead (setup=cached setup_s=0)")
	benchClusterCheckpoint = flag.Int("bench.cluster-checkpoint", 10000, "With -bench.cluster-cache, every how many Services (and their EndpointSlices) created BenchmarkScaleCluster saves a partial store (beside the final one, also saved when the setup fails), which a later run with the same key resumes from, creating only the missing objects (setup=resumed); 0: none but the one saved on failure")
	benchEtcd              = flag.String("bench.etcd", "", "The etcd BenchmarkScaleCluster runs: $ETCD_BIN when set, else the one make etcd built when there is one (it lets kube-apiserver stream lists and serve consistent reads from its cache, as production etcd does), else the etcd on the PATH")
)

// clusterEtcd is the etcd binary BenchmarkScaleCluster runs (see
// -bench.etcd) and its version, as it says.
func clusterEtcd(b *testing.B) (bin, version string) {
	bin = *benchEtcd
	if bin == "" && os.Getenv("ETCD_BIN") == "" {
		var err error
		if bin, err = etcdtest.StreamingBinary(); err != nil {
			b.Logf("%v; running the etcd on the PATH, with which kube-apiserver does not stream lists", err)
		}
	}
	if bin == "" {
		var err error
		if bin, err = etcdtest.Binary(); err != nil {
			b.Skip(err)
		}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		b.Fatalf("%s --version: %v", bin, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	version = strings.TrimSpace(strings.TrimPrefix(first, "etcd Version:"))
	return bin, version
}

// scaleCluster is the API server BenchmarkScaleCluster measures, holding
// its objects.
type scaleCluster struct {
	kas  *kubeapitest.Server
	etcd *etcdtest.Server
	// setup is how the objects came: created (through the API), saved
	// (created, and the store then saved in -bench.cluster-cache), resumed
	// (the rest created on a partial store an earlier run saved), cached
	// (a store saved so by an earlier run); setupTime what creating them
	// took (0 when cached).
	setup     string
	setupTime time.Duration
	// found is how many Services (and their slices) a resumed setup
	// found in its partial store, created how many it created.
	found, created int
}

// scaleEtcdPrefix is the API server's prefix in etcd: one a saved store
// is served under again.
const scaleEtcdPrefix = "/agent-scale-bench"

// scaleObjectsVersion names what createScaleObjects and the rest of the
// setup create: change it when they change, and saved stores are set up
// again.
const scaleObjectsVersion = "1"

// startScaleCluster starts etcd and kube-apiserver holding n Services and
// their EndpointSlices, the agent's RBAC and its node: from a store saved
// in -bench.cluster-cache by an earlier run when there is one for n and
// these binaries, else created through the API (and saved there, with a
// partial store every -bench.cluster-checkpoint objects and when the
// setup fails, which a later run resumes from).
func startScaleCluster(b *testing.B, etcdBin, kasBin string, n int, nodeName string) scaleCluster {
	o := scaleSetup{etcdBin: etcdBin, kasBin: kasBin, n: n, nodeName: nodeName, checkpoint: *benchClusterCheckpoint}
	if dir := *benchClusterCache; dir != "" {
		o.saved = filepath.Join(dir, fmt.Sprintf("services-%d-%s", n, scaleStoreKey(b, etcdBin, kasBin)))
	}
	c, err := setupScaleCluster(b, o)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// scaleSetup is what setupScaleCluster sets up: n Services on node
// nodeName, saved in saved (none when empty), with a partial store
// (saved+".partial") every checkpoint objects created (none when 0).
type scaleSetup struct {
	etcdBin, kasBin string
	n               int
	nodeName        string
	saved           string
	checkpoint      int
}

// scaleCreateHook, when set (by tests), is called before Service i is
// created; its error fails the create as the API server's would.
var scaleCreateHook func(i int) error

// setupScaleCluster is startScaleCluster's work. When creating the objects
// fails it saves what exists as a partial store and returns the error.
func setupScaleCluster(t testing.TB, o scaleSetup) (scaleCluster, error) {
	if o.saved != "" {
		if _, err := os.Stat(o.saved); err == nil {
			etcd := etcdtest.StartInMemoryWith(t, etcdtest.InMemoryOptions{Binary: o.etcdBin, Data: o.saved})
			kas := kubeapitest.StartWith(t, etcd.Endpoint(), kubeapitest.Options{EtcdPrefix: scaleEtcdPrefix})
			fmt.Printf("# agent-scale-bench: the API server's store from %s\n", o.saved)
			return scaleCluster{kas: kas, etcd: etcd, setup: "cached"}, nil
		}
	}
	partial := o.saved + ".partial"
	start := time.Now()
	data := ""
	if o.saved != "" {
		if _, err := os.Stat(partial); err == nil {
			data = partial
		}
	}
	etcd := etcdtest.StartInMemoryWith(t, etcdtest.InMemoryOptions{Binary: o.etcdBin, Data: data})
	kas := kubeapitest.StartWith(t, etcd.Endpoint(), kubeapitest.Options{EtcdPrefix: scaleEtcdPrefix})
	c := scaleCluster{kas: kas, etcd: etcd, setup: "created"}
	applyRBAC(t, kas.Admin, nil)
	podCIDR := "10.252.7.0/24"
	if err := createOnce(func() error {
		_, err := kas.Admin.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: o.nodeName, Labels: map[string]string{"kubernetes.io/hostname": o.nodeName}},
			Spec:       corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}},
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return c, fmt.Errorf("create Node %s: %w", o.nodeName, err)
	}
	admin := scaleAdmin(t, kas)
	missing, found, err := missingScaleObjects(admin, o.n)
	if err != nil {
		return c, err
	}
	if data != "" {
		c.setup, c.found = "resumed", found
		fmt.Printf("# agent-scale-bench: setup=resumed from %s: %d of %d Services and their EndpointSlices found\n", partial, found, o.n)
	}
	batch := len(missing)
	if o.saved != "" && o.checkpoint > 0 {
		batch = o.checkpoint
	}
	for len(missing) > 0 {
		todo := missing[:min(batch, len(missing))]
		missing = missing[len(todo):]
		created, err := createScaleObjects(t, kas, admin, todo, found+c.created, o.n)
		c.created += created
		if err != nil {
			if o.saved != "" {
				if serr := saveScaleStore(kas, etcd, partial); serr != nil {
					return c, fmt.Errorf("%w (and saving the partial store: %v)", err, serr)
				}
				fmt.Printf("# agent-scale-bench: partial store of %d Services and their EndpointSlices saved in %s\n", found+c.created, partial)
			}
			return c, err
		}
		if len(missing) > 0 && o.saved != "" && o.checkpoint > 0 {
			if err := saveScaleStore(kas, etcd, partial); err != nil {
				return c, err
			}
			fmt.Printf("# agent-scale-bench: partial store of %d Services and their EndpointSlices saved in %s\n", found+c.created, partial)
			etcd.Restart()
			kas.Restart(t)
		}
	}
	c.setupTime = time.Since(start)
	if o.saved == "" {
		return c, nil
	}
	// Saved from a stopped etcd, and both started again on it: what
	// follows measures a freshly started API server on that store, as a
	// run that starts from it does.
	if err := saveScaleStore(kas, etcd, o.saved); err != nil {
		return c, err
	}
	fmt.Printf("# agent-scale-bench: the API server's store saved in %s\n", o.saved)
	if err := os.RemoveAll(partial); err != nil {
		return c, err
	}
	etcd.Restart()
	kas.Restart(t)
	if c.setup == "created" {
		c.setup = "saved"
	}
	return c, nil
}

// saveScaleStore stops kas and etcd and saves etcd's data in dst, replacing
// what is there at once (a copy beside it, renamed onto it). The caller
// restarts them.
func saveScaleStore(kas *kubeapitest.Server, etcd *etcdtest.Server, dst string) error {
	kas.Stop()
	etcd.Stop()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp-%d", dst, os.Getpid())
	if err := etcd.SaveData(tmp); err != nil {
		return err
	}
	// A directory is not renamed onto one that is not empty: the old one
	// goes aside first.
	old := fmt.Sprintf("%s.old-%d", dst, os.Getpid())
	if err := os.Rename(dst, old); err != nil && !os.IsNotExist(err) {
		os.RemoveAll(tmp)
		return fmt.Errorf("save the API server's store in %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("save the API server's store in %s: %w", dst, err)
	}
	return os.RemoveAll(old)
}

// scaleStoreKey names what a saved store holds: the objects' version and
// the binaries that wrote it (their contents' hash: etcd's data format and
// the API server's encoding of the objects are theirs).
func scaleStoreKey(b testing.TB, bins ...string) string {
	h := sha256.New()
	io.WriteString(h, scaleObjectsVersion)
	for _, bin := range bins {
		f, err := os.Open(bin)
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			b.Fatalf("read %s: %v", bin, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// apiServerMeter reads what the API server spent: its CPU time and its
// etcd's from /proc, and the bytes it sent through the proxy.
type apiServerMeter struct {
	pid, etcdPID int
	proxy        *countingProxy
}

type apiServerMark struct {
	cpu, etcdCPU time.Duration
	sent         int64
}

func (m *apiServerMeter) mark(b testing.TB) apiServerMark {
	return apiServerMark{cpu: apiServerCPU(b, m.pid), etcdCPU: apiServerCPU(b, m.etcdPID), sent: m.proxy.sent.Load()}
}

// since is the API server's and etcd's CPU time and the MB sent since
// mark.
func (m *apiServerMeter) since(b testing.TB, mark apiServerMark) (cpuS, etcdCPUS, sentMB float64) {
	now := m.mark(b)
	return (now.cpu - mark.cpu).Seconds(), (now.etcdCPU - mark.etcdCPU).Seconds(), float64(now.sent-mark.sent) / (1 << 20)
}

func (m *apiServerMeter) rss(b testing.TB) float64 {
	n, err := procstat.RSS(m.pid)
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / (1 << 20)
}

// countingProxy forwards TCP connections to the API server and counts the
// bytes the server sends back (TLS passes through it untouched: the
// server's certificate names 127.0.0.1, where the proxy listens too).
type countingProxy struct {
	url  string
	sent atomic.Int64
}

func newCountingProxy(b testing.TB, target string) *countingProxy {
	u, err := url.Parse(target)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	p := &countingProxy{url: "https://" + ln.Addr().String()}
	var conns sync.WaitGroup
	b.Cleanup(func() {
		ln.Close()
		conns.Wait()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Go(func() {
				defer client.Close()
				server, err := net.Dial("tcp", u.Host)
				if err != nil {
					return
				}
				defer server.Close()
				done := make(chan struct{})
				go func() {
					io.Copy(server, client)
					server.(*net.TCPConn).CloseWrite()
					close(done)
				}()
				io.Copy(client, countingReader{server, &p.sent})
				client.(*net.TCPConn).CloseWrite()
				<-done
			})
		}
	}()
	return p
}

// countingReader adds what it reads to n as it goes: a watch's connection
// stays open.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// listModes are the ways a client lists at start that listWatchClients
// compares: a streaming list (watchlist: a WATCH with sendInitialEvents,
// from the API server's watch cache, what client-go's Reflector does by
// default); pages of 2,000 at the latest version (paged: resourceVersion
// "", a consistent read, what the agent does); one list at any version
// (rv0: resourceVersion "0", from the watch cache).
var listModes = flag.String("bench.list-modes", "watchlist,paged,rv0", "The listing modes BenchmarkScaleCluster's clients are run with, one run of -bench.clients each")

// listWatchClients runs, for each of -bench.list-modes, clients
// list-and-watches of Services and EndpointSlices at once through the
// proxy, as that many agents would, each a client-go Reflector over the
// typed clients (as the agent's load balancer runs them) into a store that
// counts what it got and keeps nothing. It returns the clients_... figures
// of the agent-scale-bench line.
func listWatchClients(b *testing.B, kas *kubeapitest.Server, server *apiServerMeter, clients int) string {
	figures := []string{fmt.Sprintf("clients=%d", clients)}
	for _, mode := range strings.Split(*listModes, ",") {
		synced, cpu, sent := listWatchClientsOnce(b, kas, server, clients, mode)
		figures = append(figures, fmt.Sprintf("clients_%s_synced_s=%.2f clients_%s_apiserver_cpu_s=%.2f clients_%s_apiserver_sent_mb_per_client=%.1f",
			mode, synced.Seconds(), mode, cpu, mode, sent/float64(clients)))
	}
	return strings.Join(figures, " ")
}

// noWatchList is a client that says it cannot stream lists: a Reflector
// given it lists.
type noWatchList struct{}

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

func listWatchClientsOnce(b *testing.B, kas *kubeapitest.Server, server *apiServerMeter, clients int, mode string) (synced time.Duration, cpuS, sentMB float64) {
	cfg := kas.Config(kubeapitest.AdminToken)
	cfg.Host = server.proxy.url
	cfg.QPS, cfg.Burst = 1000, 2000
	ctx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	defer func() {
		cancel()
		running.Wait()
	}()
	// list lists as mode says, with list calls of one kind. Paged, it
	// keeps no page: the listing is its last page, emptied.
	list := func(ctx context.Context, o metav1.ListOptions, call listCall) (runtime.Object, error) {
		switch mode {
		case "rv0":
			o.ResourceVersion, o.ResourceVersionMatch, o.Limit = "0", "", 0
			return call(ctx, o)
		case "paged":
			o.ResourceVersion, o.ResourceVersionMatch, o.Limit = "", "", 2000
			for {
				page, err := call(ctx, o)
				if err != nil {
					return nil, err
				}
				m, err := meta.ListAccessor(page)
				if err != nil {
					return nil, err
				}
				if m.GetContinue() == "" {
					return page, meta.SetList(page, nil)
				}
				o.Continue = m.GetContinue()
			}
		}
		return call(ctx, o)
	}
	var semantics any
	switch mode {
	case "watchlist":
	case "paged", "rv0":
		semantics = noWatchList{}
	default:
		b.Fatalf("unknown -bench.list-modes mode %q: want watchlist, paged or rv0", mode)
	}
	mark := server.mark(b)
	start := time.Now()
	var listed sync.WaitGroup
	for range clients {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if semantics == nil {
			semantics = cs
		}
		kinds := []struct {
			expected runtime.Object
			lw       *cache.ListWatch
		}{
			{&corev1.Service{}, typedListWatch(cs.CoreV1().Services(""), list)},
			{&discoveryv1.EndpointSlice{}, typedListWatch(cs.DiscoveryV1().EndpointSlices(""), list)},
		}
		for _, k := range kinds {
			store := &countingStore{listed: make(chan struct{})}
			r := cache.NewReflectorWithOptions(cache.ToListWatcherWithWatchListSemantics(k.lw, semantics), k.expected, store, cache.ReflectorOptions{})
			running.Go(func() { r.RunWithContext(ctx) })
			listed.Go(func() {
				select {
				case <-store.listed:
				case <-ctx.Done():
				}
			})
		}
	}
	waited := make(chan struct{})
	go func() { listed.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(10 * time.Minute):
		b.Fatalf("%d clients' listings (%s) not done after 10 minutes", clients, mode)
	}
	synced = time.Since(start)
	cpuS, _, sentMB = server.since(b, mark)
	return synced, cpuS, sentMB
}

// listCall is one kind's list call; listFunc lists with it (listing as
// the mode says).
type (
	listCall func(context.Context, metav1.ListOptions) (runtime.Object, error)
	listFunc func(context.Context, metav1.ListOptions, listCall) (runtime.Object, error)
)

// typedListWatch is the list and watch of a typed client of one kind (L
// its list type), its listings made by list.
func typedListWatch[L runtime.Object](c interface {
	List(context.Context, metav1.ListOptions) (L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}, list listFunc) *cache.ListWatch {
	call := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) }
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return list(ctx, o, call)
		},
		WatchFuncWithContext: c.Watch,
	}
}

// countingStore is a Reflector's store that keeps nothing and closes
// listed at the first complete listing.
type countingStore struct {
	listed chan struct{}
	once   sync.Once
	items  atomic.Int64
}

func (s *countingStore) Add(any) error    { s.items.Add(1); return nil }
func (s *countingStore) Update(any) error { return nil }
func (s *countingStore) Delete(any) error { return nil }
func (s *countingStore) Replace(list []any, _ string) error {
	s.items.Add(int64(len(list)))
	s.once.Do(func() { close(s.listed) })
	return nil
}
func (s *countingStore) Resync() error { return nil }

// scaleAdmin is a client of kas's admin for creating many objects.
func scaleAdmin(t testing.TB, kas *kubeapitest.Server) *kubernetes.Clientset {
	cfg := kas.Config(kubeapitest.AdminToken)
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return admin
}

// missingScaleObjects creates the bench namespace if it is missing and
// returns the indexes of the n Services whose Service or EndpointSlice is
// not there, and how many are.
func missingScaleObjects(admin *kubernetes.Clientset, n int) (missing []int, found int, err error) {
	ctx := context.Background()
	if err := createOnce(func() error {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}, metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, 0, fmt.Errorf("create Namespace bench: %w", err)
	}
	svcs, err := admin.CoreV1().Services("bench").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("list the bench Services: %w", err)
	}
	slices, err := admin.DiscoveryV1().EndpointSlices("bench").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, fmt.Errorf("list the bench EndpointSlices: %w", err)
	}
	have := make(map[string]bool, len(svcs.Items)+len(slices.Items))
	for _, s := range svcs.Items {
		have[s.Name] = true
	}
	for _, s := range slices.Items {
		have[s.Name] = true
	}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		if have[name] && have[name+"-x7k2p"] {
			found++
		} else {
			missing = append(missing, i)
		}
	}
	return missing, found, nil
}

// createOnce runs create until it succeeds, retrying what may be the API
// server's passing trouble (timeouts, 5xx, 429, a connection's error) a
// bounded number of times with backoff; AlreadyExists is success (a create
// that timed out may have been done, and a resumed setup finds objects).
// The error is the last attempt's.
func createOnce(create func() error) error {
	backoff := 500 * time.Millisecond
	const attempts = 6
	var err error
	for attempt := 1; ; attempt++ {
		err = create()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if !retriableCreate(err) || attempt == attempts {
			return fmt.Errorf("after %d attempts: %w", attempt, err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 8*time.Second)
	}
}

// retriableCreate: err may pass when the create is made again.
func retriableCreate(err error) bool {
	if apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsUnexpectedServerError(err) {
		return true
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code >= 500 {
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, context.DeadlineExceeded)
}

// createScaleObjects creates the Services of indexes todo and their
// EndpointSlices (done already exist, of n). It returns how many it
// created (both objects) before an error.
func createScaleObjects(t testing.TB, kas *kubeapitest.Server, admin *kubernetes.Clientset, todo []int, done, n int) (int, error) {
	t.Helper()
	ctx := context.Background()
	const workers = 32
	next := make(chan int)
	errs := make(chan error, workers)
	var created atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				name := fmt.Sprintf("svc-%d", i)
				svc := &corev1.Service{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench", Labels: map[string]string{"app": name}},
					Spec: corev1.ServiceSpec{
						Selector: map[string]string{"app": name},
						Ports:    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
					},
				}
				if err := createOnce(func() error {
					if scaleCreateHook != nil {
						if err := scaleCreateHook(i); err != nil {
							return err
						}
					}
					_, err := admin.CoreV1().Services("bench").Create(ctx, svc, metav1.CreateOptions{})
					return err
				}); err != nil {
					errs <- fmt.Errorf("create Service %s: %w", name, err)
					return
				}
				ready, port, proto := true, int32(8080), corev1.ProtocolTCP
				portName, node := "http", fmt.Sprintf("node-%d", i%100)
				slice := &discoveryv1.EndpointSlice{
					ObjectMeta:  metav1.ObjectMeta{Name: name + "-x7k2p", Namespace: "bench", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
					AddressType: discoveryv1.AddressTypeIPv4,
					Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
					Endpoints: []discoveryv1.Endpoint{{
						Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+i>>16, i>>8&0xff, i&0xff)},
						Conditions: discoveryv1.EndpointConditions{Ready: &ready},
						NodeName:   &node,
					}},
				}
				if err := createOnce(func() error {
					_, err := admin.DiscoveryV1().EndpointSlices("bench").Create(ctx, slice, metav1.CreateOptions{})
					return err
				}); err != nil {
					errs <- fmt.Errorf("create EndpointSlice %s: %w", slice.Name, err)
					return
				}
				created.Add(1)
			}
		})
	}
	start, cpu0 := time.Now(), apiServerCPU(t, kas.PID)
	var failed error
	for k, i := range todo {
		if k > 0 && (done+k)%5000 == 0 {
			// A setup of tens of thousands takes minutes: it says how
			// it goes, and what the API server spends on it.
			fmt.Printf("# agent-scale-bench: %d of %d Services and their EndpointSlices created, %d in %.0f s, the API server's CPU %.0f s, load %s\n",
				done+k, n, k, time.Since(start).Seconds(), (apiServerCPU(t, kas.PID) - cpu0).Seconds(), procstat.LoadAverage())
		}
		select {
		case next <- i:
			continue
		case failed = <-errs:
		}
		break
	}
	close(next)
	wg.Wait()
	close(errs)
	if failed == nil {
		failed = <-errs
	}
	return int(created.Load()), failed
}

func apiServerCPU(b testing.TB, pid int) time.Duration {
	cpu, err := procstat.CPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}
