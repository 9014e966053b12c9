package loadbalancer

import (
	"context"
	"fmt"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/kubeclient"
)

// eventQueueSize is how many converted events may wait for the writer. A
// full queue makes the reflectors wait, so a burst never grows memory
// beyond it.
const eventQueueSize = 4 * maxBatch

// objectStore is the store the client-go Reflector writes into. It keeps
// nothing: each object is converted to its compact form at once and queued
// for the writer, so no copy of a Kubernetes object outlives the call.
type objectStore[T any] struct {
	ctx    context.Context
	events chan<- k8sEvent
	kind   string

	upserted func(T) k8sEvent
	deleted  func(T) k8sEvent
	// listing starts a listing: item converts one of its objects into an
	// upsert and notes it, end makes the event that ends the listing
	// (what it did not note is gone).
	listing func() (item func(T) k8sEvent, end func() k8sEvent)
	// trim is what a paged listing leaves out of the objects' metadata:
	// what the conversion does not read.
	trim kubeclient.Trim

	// streamedEnd is set by a list call that sent its objects itself
	// (streamList): the Replace that follows, with no items, sends the end
	// of that listing.
	streamedEnd func() k8sEvent
}

func (s *objectStore[T]) send(ev k8sEvent) error {
	select {
	case s.events <- ev:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *objectStore[T]) object(obj any) (T, error) {
	o, ok := obj.(T)
	if !ok {
		return o, fmt.Errorf("%s reflector got a %T", s.kind, obj)
	}
	return o, nil
}

func (s *objectStore[T]) Add(obj any) error {
	o, err := s.object(obj)
	if err != nil {
		return err
	}
	return s.send(s.upserted(o))
}

func (s *objectStore[T]) Update(obj any) error { return s.Add(obj) }

func (s *objectStore[T]) Delete(obj any) error {
	o, err := s.object(obj)
	if err != nil {
		return err
	}
	return s.send(s.deleted(o))
}

// Replace gets the complete listing, at start and on every relist.
// Converting 50,000 objects takes a good part of a second: when the agent
// stops meanwhile, the listing is dropped.
func (s *objectStore[T]) Replace(list []any, _ string) error {
	if end := s.streamedEnd; end != nil {
		s.streamedEnd = nil
		if len(list) > 0 {
			return fmt.Errorf("%s reflector: a streamed listing came with %d items", s.kind, len(list))
		}
		return s.send(end())
	}
	objs := make([]T, 0, len(list))
	for _, obj := range list {
		o, err := s.object(obj)
		if err != nil {
			return err
		}
		objs = append(objs, o)
	}
	item, end := s.listing()
	evs, ok := convertListing(s.ctx, objs, item, end)
	if !ok {
		return s.ctx.Err()
	}
	for i, ev := range evs {
		if err := s.send(ev); err != nil {
			return err
		}
		// Let each converted object go once the writer has it.
		evs[i] = nil
	}
	return nil
}

// convertListing converts a listing into one event per object, looking at
// ctx every stoppingEvery objects, and appends the event that ends it; ok is
// false when ctx ended first.
//
// Each object is let go once converted (ks[i] is cleared): a listing of
// 50,000 typed Services is ~70 MB, its converted events a fraction of it,
// and the two listings and the tables being filled were the resident
// set's peak. objs is Replace's own slice; the Reflector does not use the
// list it hands to Replace after the call, nor keep the list it decoded
// (Replace gets shallow copies of its items, meta.ExtractListWithAlloc's).
func convertListing[K any](ctx context.Context, ks []K, convert func(K) k8sEvent, end func() k8sEvent) (evs []k8sEvent, ok bool) {
	evs = make([]k8sEvent, 0, len(ks)+1)
	var zero K
	for i, k := range ks {
		if i%stoppingEvery == 0 && ctx.Err() != nil {
			return nil, false
		}
		evs = append(evs, convert(k))
		ks[i] = zero
	}
	return append(evs, end()), true
}

// streamList lists from the embedded API server one object at a time
// (k8sclient.EmbeddedListEach), converting and sending each as it comes,
// and returns an empty list of its resource version, built by emptyList,
// for the Reflector: its Replace then ends the listing. Neither the typed
// listing nor its converted events are ever all in memory at once: at
// 50,000 Services and their EndpointSlices they were ~115 MB, the peak of
// the agent's start. ok is false outside embedded mode.
func (s *objectStore[T]) streamList(cs k8sclient.Clientset, resource schema.GroupVersionResource, kind schema.GroupVersionKind, opts metav1.ListOptions, emptyList func(rv string) runtime.Object) (runtime.Object, bool, error) {
	send, end := s.sendListing()
	rv, ok, err := k8sclient.EmbeddedListEach(cs, resource, kind, metav1.NamespaceAll, opts, send)
	if !ok || err != nil {
		return nil, ok, err
	}
	s.streamedEnd = end
	return emptyList(rv), true, nil
}

// sendListing starts a listing whose objects are converted and sent one
// at a time: send is for each object, end makes the event that ends it.
func (s *objectStore[T]) sendListing() (send func(runtime.Object) error, end func() k8sEvent) {
	item, end := s.listing()
	return func(obj runtime.Object) error {
		o, err := s.object(obj)
		if err != nil {
			return err
		}
		return s.send(item(o))
	}, end
}

// listPageSize is how many objects a page of a listing from a real API
// server asks for: a page's body read whole at a time (two with the read
// ahead), in few enough requests for the client's rate limiter's burst (at 20,000 Services and
// their EndpointSlices, pages of 500 made ready 0.7 s later than one list,
// waiting for the rate limiter; the one list's peak resident set was 100
// MB higher).
const listPageSize = 2000

// pagedList lists from a real API server a page at a time (listPages,
// kubeclient's ListPages), converting and sending each page's objects as
// they are decoded, and returns an empty list of the listing's resource
// version for the Reflector, as streamList does: the Reflector's own pager
// gathers every page into one list first (~115 MB at 50,000 Services and
// their EndpointSlices). A server that does not page (a list served from
// its watch cache may not) answers in one page, converted as the
// Reflector's list was. An error part way leaves the objects already
// sent, which are current: the Reflector lists again, and that listing's
// end settles what is gone.
//
// Pages, not a streaming list (a WATCH with sendInitialEvents): where the
// API server can serve both from its watch cache (etcd 3.5.13 and later),
// pages are gzip'd and a stream's events are not. At 20,000 Services and
// their EndpointSlices (agent-scale-bench on etcd 3.6.8), an agent's
// start was sent 2.2 MB against 20.4 MB streamed, the API server spent
// 0.8-1.1 CPU s against 1.35-1.4, and 20 clients at once cost it 7.9 CPU
// s in pages against 19.4 streamed (docs/performance.md).
//
// Each page's objects are decoded one at a time and converted at once,
// never a typed page in memory, and the next page is read meanwhile (at
// most one ahead: two pages' bodies of a kind in memory at a time).
func (s *objectStore[T]) pagedList(ctx context.Context, opts metav1.ListOptions, listPages func(context.Context, metav1.ListOptions, func(T) error) (metav1.ListMeta, error), emptyList func(rv string) runtime.Object) (runtime.Object, error) {
	item, end := s.listing()
	send := func(o T) error { return s.send(item(o)) }
	// Pages of listPageSize, whatever the Reflector's pager asks for (its
	// default of 500 on a first listing, at resourceVersion "0"; none on a
	// relist). Each page is a request that the client's rate limiter
	// counts (--k8s-api-qps 20, --k8s-api-burst 40): at 20,000 Services
	// and their EndpointSlices pages of 500 were 80 requests, and those
	// past the burst waited for it, 50 ms each, a second of a restart's
	// 2.5 s to k8s-synced (docs/performance.md).
	opts.Limit = listPageSize
	switch {
	case opts.ResourceVersion == "0":
		// "Any version" is answered from the server's cache, whole,
		// whatever the limit (kube-apiserver v1.36 does). The latest
		// version is paged.
		opts.ResourceVersion, opts.ResourceVersionMatch = "", ""
	case opts.ResourceVersion != "" && opts.ResourceVersionMatch == "":
		// A relist at the version last seen (the Reflector's after a
		// watch error). With a limit and no match, the API reads a
		// version as "exactly that one", which the cache of a restarted
		// API server lacks: every agent would read its pages from etcd
		// at an old revision, or get 410 Gone and list again. The
		// Reflector means "not older than" (it drops the limit for it).
		opts.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	}
	meta, err := listPages(ctx, opts, send)
	if err != nil {
		return nil, err
	}
	s.streamedEnd = end
	return emptyList(meta.ResourceVersion), nil
}

// Resync has nothing to do: the tables are the only copy.
func (s *objectStore[T]) Resync() error { return nil }

func serviceStore(ctx context.Context, events chan<- k8sEvent) *objectStore[*corev1.Service] {
	return &objectStore[*corev1.Service]{
		ctx: ctx, events: events, kind: "Service",
		// convertService reads of the metadata the namespace and name
		// only, and not the selector.
		trim: kubeclient.Trim{Labels: []string{}, NameOnly: true, NoSelector: true},
		upserted: func(k *corev1.Service) k8sEvent {
			svc, invalid := convertService(k)
			return &serviceUpserted{svc, invalid}
		},
		deleted: func(k *corev1.Service) k8sEvent {
			return &serviceDeleted{ServiceName{Namespace: k.Namespace, Name: k.Name}}
		},
		listing: func() (func(*corev1.Service) k8sEvent, func() k8sEvent) {
			end := &servicesListed{names: newListed(ServiceName.compare)}
			return func(k *corev1.Service) k8sEvent {
				svc, invalid := convertService(k)
				end.names.add(svc.Name)
				return &serviceUpserted{svc, invalid}
			}, func() k8sEvent { return end }
		},
	}
}

func endpointSliceStore(ctx context.Context, events chan<- k8sEvent) *objectStore[*discoveryv1.EndpointSlice] {
	return &objectStore[*discoveryv1.EndpointSlice]{
		ctx: ctx, events: events, kind: "EndpointSlice",
		// convertEndpointSlice reads of the metadata the namespace, the
		// name and the service label only.
		trim: kubeclient.Trim{Labels: []string{discoveryv1.LabelServiceName}, NameOnly: true},
		upserted: func(k *discoveryv1.EndpointSlice) k8sEvent {
			s, invalid := convertEndpointSlice(k)
			return &sliceUpserted{s, invalid}
		},
		deleted: func(k *discoveryv1.EndpointSlice) k8sEvent {
			return &sliceDeleted{sliceID{Namespace: k.Namespace, Name: k.Name}}
		},
		listing: func() (func(*discoveryv1.EndpointSlice) k8sEvent, func() k8sEvent) {
			end := &slicesListed{ids: newListed(sliceID.compare)}
			return func(k *discoveryv1.EndpointSlice) k8sEvent {
				s, invalid := convertEndpointSlice(k)
				end.ids.add(s.id)
				return &sliceUpserted{s, invalid}
			}, func() k8sEvent { return end }
		},
	}
}

// runReflector lists and watches with a client-go Reflector into store
// until ctx ends. The Reflector relists on its own after watch errors.
//
// It returns when ctx ends, without waiting for the Reflector to return: a
// call into the embedded API server cannot be interrupted, and listing or
// starting a watch over 50,000 objects there takes up to half a second of
// copying, which stopping the agent would wait for. The Reflector returns
// once that call does; the store then refuses what it brought (its sends
// end with ctx).
func runReflector(ctx context.Context, name string, expected runtime.Object, lw *cache.ListWatch, store cache.ReflectorStore) {
	r := cache.NewReflectorWithOptions(
		// The Reflector lists in pages, as every one of the agent
		// (kubeclient.Paged), through lw (its list converts as it
		// reads).
		kubeclient.Paged(lw),
		expected, store,
		cache.ReflectorOptions{Name: name},
	)
	go r.RunWithContext(ctx)
	<-ctx.Done()
}

// listWatch lists and watches a resource with list and watch, reporting
// their failures (an API server that cannot be reached, RBAC that forbids
// it) as the reflector job's health, since the Reflector only logs them
// and retries.
func listWatch(health cell.Health, resource string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) *cache.ListWatch {
	report := func(verb string, err error) {
		if err != nil {
			health.Degraded(fmt.Sprintf("%s %s failed, retrying", verb, resource), err)
		} else {
			health.OK(fmt.Sprintf("Watching %s", resource))
		}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			obj, err := list(ctx, opts)
			report("LIST", err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			w, err := watchFn(ctx, opts)
			report("WATCH", err)
			return w, err
		},
	}
}

func servicesListWatch(cs k8sclient.Clientset, health cell.Health, store *objectStore[*corev1.Service]) *cache.ListWatch {
	return kindListWatch(cs, health, store, "Services", corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service"),
		cs.CoreV1().Services(metav1.NamespaceAll), func(rv string) runtime.Object {
			return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}
		})
}

func endpointSlicesListWatch(cs k8sclient.Clientset, health cell.Health, store *objectStore[*discoveryv1.EndpointSlice]) *cache.ListWatch {
	return kindListWatch(cs, health, store, "EndpointSlices", discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
		cs.DiscoveryV1().EndpointSlices(metav1.NamespaceAll), func(rv string) runtime.Object {
			return &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}
		})
}

// kindListWatch lists and watches one kind (named plural in health) with
// c, its typed client of every namespace, L being its list type. A
// listing is the embedded server's stream (streamList) or the API server's
// pages (pagedList); each ends with emptyList, the Reflector's list of
// none at a resource version.
func kindListWatch[T any](cs k8sclient.Clientset, health cell.Health, store *objectStore[T], plural string,
	resource schema.GroupVersionResource, kind schema.GroupVersionKind, c interface {
		ListPages(context.Context, metav1.ListOptions, kubeclient.Trim, func(T) error) (metav1.ListMeta, error)
		Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
	}, emptyList func(rv string) runtime.Object,
) *cache.ListWatch {
	return listWatch(health, plural,
		func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			if list, ok, err := store.streamList(cs, resource, kind, opts, emptyList); ok {
				return list, err
			}
			listPages := func(ctx context.Context, opts metav1.ListOptions, each func(T) error) (metav1.ListMeta, error) {
				return c.ListPages(ctx, opts, store.trim, each)
			}
			return store.pagedList(ctx, opts, listPages, emptyList)
		},
		c.Watch)
}
