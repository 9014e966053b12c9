package policy

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// The benchmark's cluster: 100 namespaces (team t0..t9) of 100 workloads
// (app a0..a99) each, one identity per workload: 10,000 identities. This
// node runs 100 of the pods, one per namespace. 1,000 policies, 10 per
// namespace, each selecting the namespace's local pod and allowing
// ingress from one workload of its namespace and from one workload in the
// 10 namespaces of a team (a port of its own), and egress to one workload
// of every namespace (UDP 53): about 1,100 entries per endpoint.
const (
	benchNamespaces = 100
	benchApps       = 100
	benchPolicies   = 1000
	benchFirstID    = identity.NumericIdentity(10000)
)

func benchIdentity(ns, app int) identity.NumericIdentity {
	return benchFirstID + identity.NumericIdentity(app*benchNamespaces+ns)
}

func benchLabels(ns, app int, extra ...labels.Label) labels.Labels {
	ls := podIdentityLabels(fmt.Sprintf("ns%d", ns), map[string]string{"app": fmt.Sprintf("a%d", app)},
		map[string]string{"team": fmt.Sprintf("t%d", ns%10)})
	return labels.New(append(ls, extra...)...)
}

func benchPolicy(j int) *networkingv1.NetworkPolicy {
	ns, k := j%benchNamespaces, j/benchNamespaces
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := intstr.FromInt32(int32(8000 + k))
	p53 := intstr.FromInt32(53)
	app := func(a int) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("a%d", a%benchApps)}}
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", ns), Name: fmt.Sprintf("p%d", j)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *app(ns),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: app(ns*7 + k)}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}},
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: app((ns + k) % 50),
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("t%d", (ns+k)%10)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}},
			},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: app(ns + 10*k), NamespaceSelector: &metav1.LabelSelector{}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &p53}}},
			},
		},
	}
}

// benchEngine is the engine with every input given and nothing flushed.
func benchEngine(b *testing.B) *fixture {
	f := &fixture{t: b, db: statedb.New()}
	var err error
	if f.entries, err = NewEntriesTable(f.db); err != nil {
		b.Fatal(err)
	}
	if f.enforcement, err = NewEnforcementTable(f.db); err != nil {
		b.Fatal(err)
	}
	if f.prefixes, err = NewPrefixesTable(f.db); err != nil {
		b.Fatal(err)
	}
	f.e = newEngine(f.entries, f.enforcement, f.prefixes, func(string, string) []namedPort { return nil },
		func(string) []namedPort { return nil })
	for ns := range benchNamespaces {
		for app := range benchApps {
			f.e.addIdentity(benchIdentity(ns, app), benchLabels(ns, app))
		}
	}
	for ns := range benchNamespaces {
		f.e.setEndpoint(&endpointmanager.Endpoint{ID: uint16(ns + 1), PodNamespace: fmt.Sprintf("ns%d", ns), PodName: "pod",
			Labels: map[string]string{"app": fmt.Sprintf("a%d", ns)}, Identity: benchIdentity(ns, ns)})
	}
	for j := range benchPolicies {
		r := Translate(benchPolicy(j))
		if r.Error != "" {
			b.Fatal(r.Error)
		}
		f.e.setRule(r.Name, r)
	}
	return f
}

// BenchmarkFromScratch: the inputs given and every endpoint's entries
// computed and written into empty tables.
func BenchmarkFromScratch(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var entries, n int
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		f := benchEngine(b)
		b.StartTimer()
		c0 := threadCPU(b)
		f.flush()
		cpu += threadCPU(b) - c0
		n++
		entries = f.entries.NumObjects(f.db.ReadTxn())
	}
	b.ReportMetric(cpu.Seconds()/float64(n), "cpu-s/op")
	b.ReportMetric(float64(entries), "entries")
	b.ReportMetric(float64(entries)/benchNamespaces, "entries/endpoint")
}

// BenchmarkSetupAndFromScratch: the selector cache, the policies and the
// endpoints set up, and every entry computed and written: what a start
// costs.
func BenchmarkSetupAndFromScratch(b *testing.B) {
	for b.Loop() {
		benchEngine(b).flush()
	}
}

// BenchmarkNewIdentity: one new identity that policies of 10 local
// endpoints select (a new version of workload a5 of ns5), applied and its
// entries written; then removed again, outside the timing.
func BenchmarkNewIdentity(b *testing.B) {
	f := benchEngine(b)
	f.flush()
	next := identity.MinLocal
	var written int
	// The machine is shared: the thread's CPU time is the figure that
	// does not grow with other processes' load.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	var timed, cpu time.Duration
	for range b.N {
		t0, c0 := time.Now(), threadCPU(b)
		f.e.addIdentity(next, benchLabels(5, 5, labels.Label{Source: labels.SourceK8s, Key: "version", Value: "2"}))
		st := f.flush()
		timed += time.Since(t0)
		cpu += threadCPU(b) - c0
		written = st.written
		b.StopTimer()
		f.e.removeIdentity(next)
		f.flush()
		next++
		b.StartTimer()
	}
	if written == 0 {
		b.Fatal("the new identity wrote no entry")
	}
	b.ReportMetric(float64(written), "entries-written")
	b.ReportMetric(float64(timed.Microseconds())/float64(b.N), "µs/identity")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/identity")
	fmt.Printf("policy-bench new_identity_us=%d new_identity_cpu_us=%d entries_written=%d\n",
		timed.Microseconds()/int64(b.N), cpu.Microseconds()/int64(b.N), written)
}

// threadCPU is the CPU time the calling thread has used.
func threadCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkMemory: the Go heap each desired policy entry (the row and
// its indexes in the table "policy-entries") and each selector of the
// selector cache (with its set of identities) costs, on the setup of the
// other benchmarks. Prints "policy-bench ..." for `make bench`.
func BenchmarkMemory(b *testing.B) {
	var perEntry, perSelector float64
	for b.Loop() {
		f := benchEngine(b)
		h1 := heapInUse()
		f.flush()
		h2 := heapInUse()
		entries := f.entries.NumObjects(f.db.ReadTxn())
		perEntry = float64(h2-h1) / float64(entries)
		// The selectors: the cache without them is the identities alone.
		c := newSelectorCache()
		for ns := range benchNamespaces {
			for app := range benchApps {
				c.addIdentity(benchIdentity(ns, app), benchLabels(ns, app), func(*cachedSelector) {})
			}
		}
		h3 := heapInUse()
		for name, r := range f.e.rules {
			for _, sel := range r.selectors {
				c.acquire(sel, name)
			}
		}
		h4 := heapInUse()
		perSelector = float64(h4-h3) / float64(len(c.sels))
		runtime.KeepAlive(f)
		runtime.KeepAlive(c)
	}
	b.ReportMetric(perEntry, "B/entry")
	b.ReportMetric(perSelector, "B/selector")
	fmt.Printf("policy-bench bytes_per_entry=%.0f bytes_per_selector=%.0f\n", perEntry, perSelector)
}
