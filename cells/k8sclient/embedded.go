package k8sclient

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/meta/testrestmapper"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// NewEmbedded returns the embedded API server holding objects: the
// Clientset the agent's cells take, and the Fake behind it,
// through whose typed clients a test writes (see k8sclienttest). It is what
// embedded mode serves, without the manifests directory.
func NewEmbedded(objects ...runtime.Object) (Clientset, *Fake, error) {
	cs, _, err := newFakeClientset(objects...)
	if err != nil {
		return nil, nil, err
	}
	return newEmbeddedClientset(cs), cs, nil
}

// ResourceOf is the resource of a typed object of kubeclient.Scheme, and
// whether it is namespaced: where the embedded API server keeps it.
func ResourceOf(obj runtime.Object) (schema.GroupVersionResource, bool, error) {
	gvks, _, err := kubeclient.Scheme.ObjectKinds(obj)
	if err != nil {
		return schema.GroupVersionResource{}, false, err
	}
	m, err := restMapper().RESTMapping(gvks[0].GroupKind(), gvks[0].Version)
	if err != nil {
		return schema.GroupVersionResource{}, false, err
	}
	return m.Resource, m.Scope.Name() == meta.RESTScopeNameNamespace, nil
}

// restMapper maps the scheme's kinds to resources and scopes as client-go's
// fake does (its field-managing variant builds this same mapper), so that
// objects land where the typed clients look for them.
var restMapper = sync.OnceValue(func() meta.RESTMapper {
	return testrestmapper.TestOnlyStaticRESTMapper(kubeclient.Scheme)
})

// newFakeClientset is a Fake holding objects, in an objectStore, with
// watches that behave like an API server's. There is no field management
// (client-go's field-managing fake builds a REST mapper and a field manager
// on every write, some 6ms each, which a directory of thousands of objects
// cannot afford), and server-side apply is refused (patch.go).
//
// The objectStore, like client-go's object tracker, falls short of an API
// server's watches in ways informers notice, which the watchHub makes up
// for:
//
//   - Its watchers panic ("channel full") once 100 events wait unread. Here
//     every watch is relayed through a queue without bound, and a write
//     waits until each watch has room for its event.
//   - It keeps no history, so an object deleted between an informer's LIST
//     and its WATCH stays in the informer for good (kubernetes/kubernetes
//     issue 141528). Here a list's resource version stands for what it
//     returned, and a watch from it first reports the objects since deleted
//     (the hub notes each delete call, rather than look up every listed
//     object: that copied 50,000 Services out of the tracker, half a second).
//   - It cannot stream a list (SendInitialEvents): a reflector that was not
//     told so waits forever for the bookmark ending the initial events.
//     Here the initial events and that bookmark are sent.
//
// The objectStore keeps objects encoded, where client-go's tracker keeps
// them typed.
//
// Calls through the clientset's API are serialized by the Fake, so no
// write slips in between the steps of a list or a watch.
func newFakeClientset(objects ...runtime.Object) (*Fake, *objectStore, error) {
	cs := newFake()
	store := newObjectStore()
	for _, obj := range objects {
		if err := store.Add(obj); err != nil {
			return nil, nil, fmt.Errorf("add %T: %w", obj, err)
		}
	}
	cs.AddReactor("*", "*", objectReaction(store))
	hub := newWatchHub(store)
	cs.PrependReactor("*", "*", func(action Action) (bool, runtime.Object, error) {
		switch action.Verb {
		case "delete":
			hub.waitForRoom()
			hub.noteDeletion(action)
		case "create", "update", "patch":
			hub.waitForRoom()
		case "list":
			if action.streamed {
				return hub.streamList(action)
			}
			return hub.list(action)
		}
		return false, nil, nil
	})
	cs.PrependWatchReactor("*", func(action Action) (bool, watch.Interface, error) {
		w, err := hub.watch(action.Resource, action.Namespace, action.ListOptions)
		return true, w, err
	})
	return cs, store, nil
}

// A list is remembered for one watch to start from, for listSnapshotTTL,
// and among the last maxListSnapshots lists: most lists are never followed
// by a watch, and a reflector watches right after its list. A watch from a
// forgotten list gets 410 Gone, and its reflector lists again.
const (
	listSnapshotTTL  = time.Minute
	maxListSnapshots = 64
)

// watchHub serves the watches of one fake clientset.
type watchHub struct {
	store *objectStore
	// objects does the store's part of a list.
	objects ReactionFunc

	mu sync.Mutex
	// drained is signalled whenever a relay takes an event off its source.
	drained *sync.Cond
	watches map[*queuedWatch]struct{}
	// lists are the recent lists by the resource version handed out with
	// them, oldest first in listOrder.
	lists     map[string]*listSnapshot
	listOrder []string
	lastList  uint64
	// deleted are the deletions made through the clientset since the
	// oldest remembered list, the last of them the deletionsSeen-th: a
	// watch from a list reports those of its objects deleted since,
	// without copying every object out of the tracker to find out.
	deleted       []deletedObject
	deletionsSeen uint64
}

// noteDeletion records a delete call. A delete that fails deleted nothing
// that a list could hold, so recording it anyway is harmless.
func (h *watchHub) noteDeletion(action Action) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.deletionsSeen++
	if len(h.lists) > 0 {
		h.deleted = append(h.deleted, deletedObject{action.Resource, action.Namespace, action.Name})
	}
}

// trimDeletions forgets the deletions no remembered list needs.
func (h *watchHub) trimDeletions() {
	oldest := h.deletionsSeen
	for _, snap := range h.lists {
		oldest = min(oldest, snap.deletions)
	}
	first := h.deletionsSeen - uint64(len(h.deleted))
	if drop := oldest - first; drop > 0 {
		h.deleted = slices.Delete(h.deleted, 0, int(drop))
	}
}

// deletedSince are the objects of resource in namespace (all for "")
// deleted since a list that had seen since deletions. h.mu is held.
func (h *watchHub) deletedSince(resource schema.GroupVersionResource, namespace string, since uint64) map[[2]string]bool {
	first := h.deletionsSeen - uint64(len(h.deleted))
	out := map[[2]string]bool{}
	for i, d := range h.deleted {
		if first+uint64(i) >= since && d.resource == resource && (namespace == "" || d.namespace == namespace) {
			out[[2]string{d.namespace, d.name}] = true
		}
	}
	return out
}

// listSnapshot is what a list returned.
type listSnapshot struct {
	taken     time.Time
	resource  schema.GroupVersionResource
	namespace string
	// trackerVersion is the tracker's resource version at the list, from
	// which its watchers send what changed since.
	trackerVersion string
	// The listed objects: decoded, or as the store holds them (a list
	// through EmbeddedListEach, which decodes them one at a time).
	objects []runtime.Object
	encoded []matchingObject
	// deletions is how many deletions the hub had seen at the list.
	deletions uint64
}

// deletedObject is a deletion the hub saw.
type deletedObject struct {
	resource        schema.GroupVersionResource
	namespace, name string
}

func newWatchHub(store *objectStore) *watchHub {
	h := &watchHub{
		store:   store,
		objects: objectReaction(store),
		watches: map[*queuedWatch]struct{}{},
		lists:   map[string]*listSnapshot{},
	}
	h.drained = sync.NewCond(&h.mu)
	return h
}

// list serves a list, and remembers it under the resource version it
// returns.
func (h *watchHub) list(action Action) (bool, runtime.Object, error) {
	handled, list, err := h.objects(action)
	if !handled || err != nil {
		return handled, list, err
	}
	listMeta, items, err := ListItems(list)
	if err != nil {
		return true, nil, err
	}
	listMeta.SetResourceVersion(h.remember(&listSnapshot{
		resource:       action.Resource,
		namespace:      action.Namespace,
		trackerVersion: listMeta.GetResourceVersion(),
		objects:        items,
	}))
	return true, list, nil
}

// streamList answers EmbeddedListEach: the store's objects, not decoded,
// remembered for a watch from the list as list's are.
func (h *watchHub) streamList(action Action) (bool, runtime.Object, error) {
	version, listed := h.store.snapshot(action.Resource, action.Namespace)
	rv := h.remember(&listSnapshot{
		resource:       action.Resource,
		namespace:      action.Namespace,
		trackerVersion: strconv.FormatInt(version, 10),
		encoded:        listed,
	})
	return true, &streamedList{resourceVersion: rv, objects: listed}, nil
}

func (h *watchHub) remember(snap *listSnapshot) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	snap.taken = time.Now()
	for len(h.listOrder) > 0 {
		oldest := h.lists[h.listOrder[0]]
		if oldest != nil && len(h.listOrder) < maxListSnapshots && snap.taken.Sub(oldest.taken) < listSnapshotTTL {
			break
		}
		delete(h.lists, h.listOrder[0])
		h.listOrder = h.listOrder[1:]
	}
	h.lastList++
	version := strconv.FormatUint(h.lastList, 10)
	snap.deletions = h.deletionsSeen
	h.lists[version] = snap
	h.listOrder = append(h.listOrder, version)
	h.trimDeletions()
	return version
}

// takeSnapshot returns the list with that version, and the objects
// deleted since it, and forgets it.
func (h *watchHub) takeSnapshot(version string) (*listSnapshot, map[[2]string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	snap := h.lists[version]
	delete(h.lists, version)
	var deleted map[[2]string]bool
	if snap != nil {
		deleted = h.deletedSince(snap.resource, snap.namespace, snap.deletions)
	}
	h.trimDeletions()
	if snap != nil && time.Since(snap.taken) > listSnapshotTTL {
		return nil, nil
	}
	return snap, deleted
}

// waitForRoom returns once every watch's source can take one more event
// without panicking. The relays drain their sources without ever waiting
// for readers, so this is a matter of their being scheduled.
func (h *watchHub) waitForRoom() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.full() {
		h.drained.Wait()
	}
}

func (h *watchHub) full() bool {
	for w := range h.watches {
		if ch := w.source.ResultChan(); len(ch) >= cap(ch) {
			return true
		}
	}
	return false
}

// watch opens a watch as an API server would. From a list's resource
// version, it first reports the listed objects deleted since (the tracker
// sends those created or changed). Without a resource version ("" or "0"),
// or for a streaming list, the existing objects come first as ADDED; a
// streaming list ends them with the bookmark its reflector waits for.
func (h *watchHub) watch(gvr schema.GroupVersionResource, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	streaming := opts.SendInitialEvents != nil && *opts.SendInitialEvents
	var initial []watch.Event
	if !streaming && opts.ResourceVersion != "" && opts.ResourceVersion != "0" {
		snap, deleted := h.takeSnapshot(opts.ResourceVersion)
		if snap == nil || snap.resource != gvr || snap.namespace != ns {
			return nil, apierrors.NewResourceExpired(fmt.Sprintf(
				"resource version %s of %s is not one of the recent lists: list again", opts.ResourceVersion, gvr.Resource))
		}
		for _, obj := range snap.objects {
			if len(deleted) == 0 {
				break
			}
			acc, err := meta.Accessor(obj)
			if err != nil {
				return nil, err
			}
			if deleted[[2]string{acc.GetNamespace(), acc.GetName()}] {
				initial = append(initial, watch.Event{Type: watch.Deleted, Object: obj})
			}
		}
		for _, m := range snap.encoded {
			if len(deleted) == 0 {
				break
			}
			if deleted[[2]string{m.key.Namespace, m.key.Name}] {
				obj, err := m.obj.decode()
				if err != nil {
					return nil, err
				}
				initial = append(initial, watch.Event{Type: watch.Deleted, Object: obj})
			}
		}
		opts.ResourceVersion = snap.trackerVersion
		return h.start(gvr, ns, opts, initial)
	}

	gvk, err := restMapper().KindFor(gvr)
	if err != nil {
		return nil, err
	}
	list, err := h.store.List(gvr, gvk, ns)
	if err != nil {
		return nil, err
	}
	listMeta, items, err := ListItems(list)
	if err != nil {
		return nil, err
	}
	for _, obj := range items {
		initial = append(initial, watch.Event{Type: watch.Added, Object: obj})
	}
	if streaming {
		bookmark, err := kubeclient.Scheme.New(gvk)
		if err != nil {
			return nil, err
		}
		bm, err := meta.Accessor(bookmark)
		if err != nil {
			return nil, err
		}
		// The reflector watches again from here when this watch ends.
		bm.SetResourceVersion(h.remember(&listSnapshot{
			resource: gvr, namespace: ns, trackerVersion: listMeta.GetResourceVersion(), objects: items,
		}))
		bm.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		initial = append(initial, watch.Event{Type: watch.Bookmark, Object: bookmark})
	}
	opts.ResourceVersion = listMeta.GetResourceVersion()
	return h.start(gvr, ns, opts, initial)
}

// start watches the tracker from opts.ResourceVersion, after initial.
func (h *watchHub) start(gvr schema.GroupVersionResource, ns string, opts metav1.ListOptions, initial []watch.Event) (watch.Interface, error) {
	w, err := h.store.Watch(gvr, ns, opts)
	if err != nil {
		return nil, err
	}
	return h.relay(w, initial), nil
}

// relay starts relaying source, after the initial events.
func (h *watchHub) relay(source watch.Interface, initial []watch.Event) *queuedWatch {
	w := &queuedWatch{hub: h, source: source, queue: initial, out: make(chan watch.Event), stop: make(chan struct{})}
	h.mu.Lock()
	h.watches[w] = struct{}{}
	h.mu.Unlock()
	go w.relay()
	return w
}

// queuedWatch relays a watch through a queue without bound, so the writer
// never waits for the reader.
type queuedWatch struct {
	hub    *watchHub
	source watch.Interface
	queue  []watch.Event
	out    chan watch.Event
	stop   chan struct{}
	once   sync.Once
}

func (w *queuedWatch) relay() {
	defer func() {
		w.hub.mu.Lock()
		delete(w.hub.watches, w)
		w.hub.drained.Broadcast()
		w.hub.mu.Unlock()
		close(w.out)
	}()
	in := w.source.ResultChan()
	for in != nil || len(w.queue) > 0 {
		var out chan watch.Event
		var next watch.Event
		if len(w.queue) > 0 {
			out, next = w.out, w.queue[0]
		}
		select {
		case ev, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			w.queue = append(w.queue, ev)
			w.hub.mu.Lock()
			w.hub.drained.Broadcast()
			w.hub.mu.Unlock()
		case out <- next:
			w.queue[0] = watch.Event{}
			w.queue = w.queue[1:]
		case <-w.stop:
			return
		}
	}
}

func (w *queuedWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *queuedWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.source.Stop()
	})
}

// EmbeddedListEach lists the objects of resource (of kind) in namespace ns
// ("": all) from the embedded API server, handing them to each one at a
// time, each decoded from the server's encoding just before: no list of
// every object is made (a listing of 50,000 typed Services is ~70 MB, all
// of it alive at once). It returns the list's resource version, from which a watch
// reports what changed since, as after any list. The call goes through the
// fake's reactors as any LIST does (a test's reactor may fail it, and it
// is recorded). An error from each ends the listing with it. Not handled
// (false) for a real cluster, nor for a label or field selector.
func EmbeddedListEach(cs Clientset, resource schema.GroupVersionResource, kind schema.GroupVersionKind, ns string, opts metav1.ListOptions, each func(runtime.Object) error) (string, bool, error) {
	e, ok := cs.(embeddedClientset)
	if !ok || opts.LabelSelector != "" || opts.FieldSelector != "" {
		return "", false, nil
	}
	ret, err := e.fake.invoke(Action{Request: kubeclient.Request{
		Verb: "list", Resource: resource, Kind: kind, Namespace: ns, ListOptions: opts,
	}, streamed: true})
	if err != nil {
		return "", true, err
	}
	if l, ok := ret.(*streamedList); ok {
		for _, m := range l.objects {
			obj, err := m.obj.decode()
			if err != nil {
				return "", true, fmt.Errorf("list %s: %s: %w", resource.Resource, m.key, err)
			}
			if acc, err := meta.Accessor(obj); err == nil {
				// The same strings as the store's key: what the
				// consumer keeps of the object (the load balancer's
				// rows, a name per Service and EndpointSlice) shares
				// them instead of holding copies of its own.
				acc.SetNamespace(m.key.Namespace)
				acc.SetName(m.key.Name)
			}
			if err := each(obj); err != nil {
				return "", true, err
			}
		}
		return l.resourceVersion, true, nil
	}
	// A list some other reactor made.
	if ret == nil {
		return "", true, fmt.Errorf("list %s: the embedded server returned nothing", resource.Resource)
	}
	listMeta, items, err := ListItems(ret)
	if err != nil {
		return "", true, err
	}
	for _, obj := range items {
		if err := each(obj); err != nil {
			return "", true, err
		}
	}
	return listMeta.GetResourceVersion(), true, nil
}

// ListItems is a list's metadata (resource version, continue token) and
// its items.
func ListItems(list runtime.Object) (metav1.ListInterface, []runtime.Object, error) {
	listMeta, err := meta.ListAccessor(list)
	if err != nil {
		return nil, nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, nil, err
	}
	return listMeta, items, nil
}

// streamedList is the hub's answer to the list of EmbeddedListEach: the listed
// objects as the store holds them, and the list's resource version.
type streamedList struct {
	resourceVersion string
	objects         []matchingObject
}

func (l *streamedList) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (l *streamedList) DeepCopyObject() runtime.Object {
	c := *l
	return &c
}
