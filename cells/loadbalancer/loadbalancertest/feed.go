// Package loadbalancertest generates Kubernetes Services and EndpointSlices
// for benchmarks of the load-balancing pipeline, answering the reflectors'
// LISTs and WATCHes of a fake clientset. The objects are made when the feed
// is, before a benchmark starts its clock and takes its first heap figure,
// as Cilium's benchmark makes its own: the rate is the agent's, not that of
// making objects, and the heap figure the agent's own state. (Made on the
// fly they were a third of the allocations of an insert.)
package loadbalancertest

import (
	"net/netip"
	"strconv"
	"sync"

	"github.com/cellium/cellium/cells/k8sclient"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
)

// Modes of a Feed: how the N services reach the reflectors.
const (
	// Watch: the initial LIST is empty; services arrive as ADDED events.
	Watch = "watch"
	// List: the services are in the initial LIST.
	List = "list"
)

// Feed serves N ClusterIP Services, each with an EndpointSlice of one ready
// endpoint, once Start is closed. Delete streams their deletion.
//
// In Watch mode the EndpointSlices are added before the Services, and the
// Services deleted before the EndpointSlices, as Cilium's load-balancer
// benchmark feeds them: each frontend is then written once, with its
// backend, and deleted once. Streamed side by side, how the two streams
// interleaved decided how many frontends were first written without a
// backend and then again with it, and the insert rate of two runs differed
// by half.
type Feed struct {
	N    int
	Mode string
	// Start releases the LISTs (and, in Watch mode, the ADDED events).
	Start chan struct{}
	// deletes, when closed, streams DELETED events for every object.
	deletes chan struct{}
	// slicesAdded and servicesDeleted order the two streams.
	slicesAdded, servicesDeleted *step

	services []*corev1.Service
	slices   []*discoveryv1.EndpointSlice
}

// step is a point one stream reaches and the other waits for.
type step struct {
	done chan struct{}
	once sync.Once
}

func newStep() *step     { return &step{done: make(chan struct{})} }
func (s *step) reached() { s.once.Do(func() { close(s.done) }) }

// NewFeed makes a feed of n services, and the objects it serves.
func NewFeed(n int, mode string) *Feed {
	f := &Feed{
		N: n, Mode: mode, Start: make(chan struct{}), deletes: make(chan struct{}),
		slicesAdded: newStep(), servicesDeleted: newStep(),
		services: make([]*corev1.Service, n), slices: make([]*discoveryv1.EndpointSlice, n),
	}
	for i := range n {
		f.services[i], f.slices[i] = Service(i), Slice(i)
	}
	return f
}

// Delete streams the deletion of every service and slice.
func (f *Feed) Delete() { close(f.deletes) }

// Attach answers cs's LISTs and WATCHes of services and endpointslices.
func (f *Feed) Attach(cs *k8sclient.Fake) {
	for _, resource := range []string{"services", "endpointslices"} {
		cs.PrependReactor("list", resource, func(k8sclient.Action) (bool, runtime.Object, error) {
			<-f.Start
			if f.Mode == List {
				return true, f.list(resource, f.N), nil
			}
			return true, f.list(resource, 0), nil
		})
		cs.PrependWatchReactor(resource, func(k8sclient.Action) (bool, watch.Interface, error) {
			events := make(chan watch.Event)
			w := watch.NewProxyWatcher(events)
			go f.stream(resource, events, w.StopChan())
			return true, w, nil
		})
	}
}

func (f *Feed) list(resource string, n int) runtime.Object {
	meta := metav1.ListMeta{ResourceVersion: "1"}
	if resource == "services" {
		l := &corev1.ServiceList{ListMeta: meta, Items: make([]corev1.Service, n)}
		for i := range n {
			l.Items[i] = *f.services[i]
		}
		return l
	}
	l := &discoveryv1.EndpointSliceList{ListMeta: meta, Items: make([]discoveryv1.EndpointSlice, n)}
	for i := range n {
		l.Items[i] = *f.slices[i]
	}
	return l
}

func (f *Feed) stream(resource string, events chan<- watch.Event, stop <-chan struct{}) {
	send := func(t watch.EventType) bool {
		for i := range f.N {
			var obj runtime.Object
			if resource == "services" {
				obj = f.services[i]
			} else {
				obj = f.slices[i]
			}
			select {
			case events <- watch.Event{Type: t, Object: obj}:
			case <-stop:
				return false
			}
		}
		return true
	}
	wait := func(s *step) bool {
		select {
		case <-s.done:
			return true
		case <-stop:
			return false
		}
	}
	if f.Mode == Watch {
		if resource == "services" && !wait(f.slicesAdded) {
			return
		}
		if !send(watch.Added) {
			return
		}
		if resource == "endpointslices" {
			f.slicesAdded.reached()
		}
	}
	select {
	case <-f.deletes:
	case <-stop:
		return
	}
	if resource == "endpointslices" && !wait(f.servicesDeleted) {
		return
	}
	if send(watch.Deleted) && resource == "services" {
		f.servicesDeleted.reached()
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

// Service is the i-th generated Service, svc-i in namespace bench.
func Service(i int) *corev1.Service {
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

// Slice is the EndpointSlice of the i-th Service: one ready endpoint.
func Slice(i int) *discoveryv1.EndpointSlice {
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
