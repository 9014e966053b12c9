package loadbalancer_test

import (
	"context"
	"flag"
	"iter"
	"log/slog"
	"net/netip"
	goruntime "runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/loadbalancer"
)

var benchServices = flag.Int("lb.services", 50000, "Services (each with one endpoint) per benchmark run")

// BenchmarkK8sToFrontends pushes Services, each with an EndpointSlice of one
// endpoint, through the reflectors into the tables, until a stand-in for the
// lb-maps reconciler (which writes nothing) has reconciled every frontend
// with its backend. "watch" streams them as watch events after start, "list"
// hands them over as the initial LIST. The generated objects are dropped as
// soon as the reflector has them, so the live heap is the agent's own state.
//
//	go test ./cells/loadbalancer -run '^$' -bench K8sToFrontends -benchtime 1x -cpu 2
func BenchmarkK8sToFrontends(b *testing.B) {
	for _, mode := range []string{"watch", "list"} {
		b.Run(mode, func(b *testing.B) {
			n := *benchServices
			var r runResult
			for range b.N {
				r = runK8sToFrontends(b, mode, n)
			}
			b.ReportMetric(r.servicesPerSec, "services/s")
			b.ReportMetric(r.cpuPerService, "cpu-µs/service")
			b.ReportMetric(r.liveBytes, "live-B/service")
			b.ReportMetric(r.allocBytes, "alloc-B/service")
		})
	}
}

// runResult are the figures of one run, per service.
type runResult struct {
	servicesPerSec float64
	// cpuPerService is the process's CPU time (user and system): unlike
	// the rate, it does not depend on what else the machine runs.
	cpuPerService float64
	liveBytes     float64
	allocBytes    float64
}

func runK8sToFrontends(b *testing.B, mode string, n int) runResult {
	b.StopTimer()
	feed := &generatedK8s{n: n, mode: mode, start: make(chan struct{})}
	counter := &reconciledCounter{want: int64(n), done: make(chan struct{})}
	h := celltest.New(
		loadbalancer.Cell,
		k8sclient.FakeCell(),
		cell.Invoke(feed.attach),
		cell.Provide(func() daemon.NodeName { return nodeName }),
		cell.Provide(func(db *statedb.DB) (statedb.Table[*devices.NodeAddress], error) {
			return statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		}),
		cell.Module("bench-lb-maps", "Stand-in for the lb-maps reconciler",
			cell.ProvidePrivate(job.Registry.NewGroup),
			cell.Invoke(counter.register),
		),
	)
	log := slog.New(slog.DiscardHandler)
	if err := h.Start(log, context.Background()); err != nil {
		b.Fatal(err)
	}
	defer h.Stop(log, context.Background())

	before := memStats()
	cpuBefore := cpuTime()
	b.StartTimer()
	start := time.Now()
	close(feed.start)
	select {
	case <-counter.done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d frontends reconciled after 5 minutes", counter.n.Load(), n)
	}
	elapsed := time.Since(start)
	cpu := cpuTime() - cpuBefore
	b.StopTimer()
	after := memStats()
	return runResult{
		servicesPerSec: float64(n) / elapsed.Seconds(),
		cpuPerService:  float64(cpu.Microseconds()) / float64(n),
		liveBytes:      float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n),
		allocBytes:     float64(after.TotalAlloc-before.TotalAlloc) / float64(n),
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func memStats() goruntime.MemStats {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms
}

// reconciledCounter is a reconciler that writes nothing and closes done
// once want frontends were reconciled with a backend. Each generated
// frontend gets its one backend once and never changes after, so counting
// needs no memory per frontend.
type reconciledCounter struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *reconciledCounter) register(p reconciler.Params, tbl statedb.RWTable[*loadbalancer.Frontend]) error {
	_, err := reconciler.Register(p, tbl,
		(*loadbalancer.Frontend).Clone, (*loadbalancer.Frontend).SetStatus, (*loadbalancer.Frontend).GetStatus,
		c, nil)
	return err
}

func (c *reconciledCounter) Update(_ context.Context, _ statedb.ReadTxn, _ statedb.Revision, fe *loadbalancer.Frontend) error {
	if len(fe.Backends) > 0 && c.n.Add(1) == c.want {
		close(c.done)
	}
	return nil
}

func (c *reconciledCounter) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *loadbalancer.Frontend) error {
	return nil
}

func (c *reconciledCounter) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*loadbalancer.Frontend, statedb.Revision]) error {
	return nil
}

// generatedK8s answers the reflectors' LISTs and WATCHes with generated
// objects, made only when asked for, once start is closed.
type generatedK8s struct {
	n     int
	mode  string
	start chan struct{}
}

func (g *generatedK8s) attach(cs *fake.Clientset) {
	mode := g.mode
	for _, resource := range []string{"services", "endpointslices"} {
		cs.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
			<-g.start
			if mode == "list" {
				return true, g.list(resource, g.n), nil
			}
			return true, g.list(resource, 0), nil
		})
		cs.PrependWatchReactor(resource, func(k8stesting.Action) (bool, watch.Interface, error) {
			events := make(chan watch.Event)
			w := watch.NewProxyWatcher(events)
			if mode == "watch" {
				go g.stream(resource, events, w.StopChan())
			}
			return true, w, nil
		})
	}
}

func (g *generatedK8s) list(resource string, n int) runtime.Object {
	meta := metav1.ListMeta{ResourceVersion: "1"}
	if resource == "services" {
		l := &corev1.ServiceList{ListMeta: meta, Items: make([]corev1.Service, n)}
		for i := range n {
			l.Items[i] = *benchService(i)
		}
		return l
	}
	l := &discoveryv1.EndpointSliceList{ListMeta: meta, Items: make([]discoveryv1.EndpointSlice, n)}
	for i := range n {
		l.Items[i] = *benchSlice(i)
	}
	return l
}

func (g *generatedK8s) stream(resource string, events chan<- watch.Event, stop <-chan struct{}) {
	for i := range g.n {
		var obj runtime.Object
		if resource == "services" {
			obj = benchService(i)
		} else {
			obj = benchSlice(i)
		}
		select {
		case events <- watch.Event{Type: watch.Added, Object: obj}:
		case <-stop:
			return
		}
	}
}

// Some ranges as a real cluster would have them: ClusterIPs from
// 10.96.0.0/12, pod IPs from 10.244.0.0/16 and up, 100 nodes.
var (
	serviceCIDRBase = netip.MustParseAddr("10.96.0.0").As4()
	podCIDRBase     = netip.MustParseAddr("10.244.0.0").As4()
)

func nthAddr(base [4]byte, i int) string {
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

func benchService(i int) *corev1.Service {
	ip := nthAddr(serviceCIDRBase, i)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: "svc-" + strconv.Itoa(i), Namespace: "bench",
			ResourceVersion: strconv.Itoa(i + 2),
			Labels:          map[string]string{"app": "svc-" + strconv.Itoa(i)},
		},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Selector:   map[string]string{"app": "svc-" + strconv.Itoa(i)},
			Ports: []corev1.ServicePort{{
				Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

func benchSlice(i int) *discoveryv1.EndpointSlice {
	name, port, proto, ready := "http", int32(8080), corev1.ProtocolTCP, true
	node := "node-" + strconv.Itoa(i%100)
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: "svc-" + strconv.Itoa(i) + "-x7k2p", Namespace: "bench",
			ResourceVersion: strconv.Itoa(i + 2),
			Labels:          map[string]string{discoveryv1.LabelServiceName: "svc-" + strconv.Itoa(i)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{nthAddr(podCIDRBase, i)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &node,
		}},
	}
}
