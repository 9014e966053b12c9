package k8sclient_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
)

func service(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
}

// serviceWatcher is the kind of cell k8sclienttest.Cell is for: it takes the
// Clientset and starts an informer in its start hook.
type serviceWatcher struct {
	cs      k8sclient.Clientset
	stop    chan struct{}
	initial int
	added   chan string
}

func (w *serviceWatcher) Start(ctx cell.HookContext) error {
	w.stop = make(chan struct{})
	inf := k8sclient.NewInformer(w.cs, w.cs.CoreV1().Services(""), &corev1.Service{}, nil)
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				w.initial++
			} else {
				w.added <- obj.(*corev1.Service).Name
			}
		},
	})
	if err != nil {
		return err
	}
	go inf.Run(w.stop)
	// Synced once the handler has had the whole initial list.
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return ctx.Err()
	}
	return nil
}

func (w *serviceWatcher) Stop(cell.HookContext) error {
	close(w.stop)
	return nil
}

func TestTestCellInAnotherCellsTest(t *testing.T) {
	w := &serviceWatcher{added: make(chan string, 1)}
	var cs *k8sclient.Fake
	h := celltest.New(
		k8sclienttest.Cell(service("web"), service("dns")),
		cell.Module("service-watcher", "Test cell watching services",
			cell.Invoke(func(lc cell.Lifecycle, c k8sclient.Clientset, f *k8sclient.Fake) {
				w.cs, cs = c, f
				lc.Append(w)
			}),
		),
	)
	celltest.Start(t, h)
	if !w.cs.Embedded() {
		t.Error("k8sclienttest.Cell's Clientset is not Embedded()")
	}
	if w.initial != 2 {
		t.Fatalf("informer listed %d services at start, want the 2 seeded ones", w.initial)
	}
	if _, err := cs.CoreV1().Services("default").Create(context.Background(), service("api"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if name := <-w.added; name != "api" {
		t.Fatalf("informer saw %q added, want api", name)
	}
}

func TestTestCellRejectsDuplicates(t *testing.T) {
	h := celltest.New(k8sclienttest.Cell(service("web"), service("web")), cell.Invoke(func(k8sclient.Clientset) {}))
	err := h.Populate(hivetest.Logger(t))
	if err == nil {
		t.Fatal("no error for the same Service seeded twice")
	}
}

// The fake's own watchers panic once 100 events wait; the embedded API
// server's queue instead. A watch started without a resource version gets
// the existing objects first, as from an API server.
func TestWatchQueuesEvents(t *testing.T) {
	var cs *k8sclient.Fake
	h := celltest.New(k8sclienttest.Cell(), cell.Invoke(func(f *k8sclient.Fake) { cs = f }))
	celltest.Start(t, h)
	ctx := context.Background()
	const existing, added = 300, 1000
	for i := range existing {
		if _, err := cs.CoreV1().Services("default").Create(ctx, service(fmt.Sprintf("old-%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w, err := cs.CoreV1().Services("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := range added {
		if _, err := cs.CoreV1().Services("default").Create(ctx, service(fmt.Sprintf("new-%d", i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range existing + added {
		ev := <-w.ResultChan()
		if ev.Type != watch.Added {
			t.Fatalf("event %d is %s, want ADDED", i, ev.Type)
		}
		want := fmt.Sprintf("new-%d", i-existing)
		if i < existing {
			continue // existing objects come in the tracker's order
		}
		if name := ev.Object.(*corev1.Service).Name; name != want {
			t.Fatalf("event %d is for %s, want %s", i, name, want)
		}
	}
}

// A reflector over a hand-made ListWatch asks for a streaming list, which
// client-go's fake cannot serve; the embedded API server can.
func TestStreamingListReflector(t *testing.T) {
	var cs *k8sclient.Fake
	h := celltest.New(k8sclienttest.Cell(service("web"), service("dns")), cell.Invoke(func(f *k8sclient.Fake) { cs = f }))
	celltest.Start(t, h)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return cs.CoreV1().Services("").List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Services("").Watch(ctx, opts)
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &corev1.Service{}, 0, cache.Indexers{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("informer over a streaming list did not sync")
	}
	if keys := informer.GetStore().ListKeys(); len(keys) != 2 {
		t.Fatalf("informer has %v, want default/web and default/dns", keys)
	}
	streamed := false
	for _, a := range cs.Actions() {
		if a.Verb == "watch" && a.ListOptions.SendInitialEvents != nil && *a.ListOptions.SendInitialEvents {
			streamed = true
		}
	}
	if !streamed {
		t.Fatal("the reflector did not ask for a streaming list: the test no longer covers it")
	}
}

// A reflector lists, then watches from the list's resource version. An
// object deleted in between must be reported, or the informer keeps it for
// good (client-go's fake alone loses it).
func TestWatchFromListReportsDeletionsSince(t *testing.T) {
	var cs *k8sclient.Fake
	h := celltest.New(k8sclienttest.Cell(service("web"), service("dns")), cell.Invoke(func(f *k8sclient.Fake) { cs = f }))
	celltest.Start(t, h)
	ctx := context.Background()
	list, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Services("default").Delete(ctx, "dns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services("default").Create(ctx, service("api"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Services("").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var got []string
	timeout := time.After(30 * time.Second)
	for range 2 {
		select {
		case ev := <-w.ResultChan():
			got = append(got, fmt.Sprintf("%s %s", ev.Type, ev.Object.(*corev1.Service).Name))
		case <-timeout:
			t.Fatalf("events %v, then none", got)
		}
	}
	if want := []string{"DELETED dns", "ADDED api"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", got, want)
	}

	// A list serves one watch; from then on, and from a version that is
	// no list's, a watch is expired: the reflector lists again.
	for _, version := range []string{list.ResourceVersion, "12345"} {
		_, err = cs.CoreV1().Services("").Watch(ctx, metav1.ListOptions{ResourceVersion: version})
		if !apierrors.IsResourceExpired(err) {
			t.Fatalf("watch from version %s: %v, want 410 Expired", version, err)
		}
	}
}

// EmbeddedListEach hands over what EmbeddedList lists, one object at a
// time, in the same order; a watch from its resource version reports what
// was deleted since, as from a list's; it goes through the fake's reactors
// (a reactor's error is its error, and the call is recorded); an error
// from each ends it; selectors are left to the typed client.
// The objects of an embedded listing hold the store's strings for their
// namespace and name, not copies decoded for them (a consumer such as the
// load balancer keeps them in its rows): two listings give the same memory.
func TestEmbeddedListEachSharesNames(t *testing.T) {
	// Longer than a byte: Go has a single-byte string of each value.
	cs, _, err := k8sclient.NewEmbedded(service("frontend-web"), service("backend-api"))
	if err != nil {
		t.Fatal(err)
	}
	gvr, gvk := corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service")
	list := func() (names, namespaces []string) {
		t.Helper()
		if _, _, err := k8sclient.EmbeddedListEach(cs, gvr, gvk, "", metav1.ListOptions{}, func(obj runtime.Object) error {
			svc := obj.(*corev1.Service)
			names, namespaces = append(names, svc.Name), append(namespaces, svc.Namespace)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return names, namespaces
	}
	names, namespaces := list()
	again, againNS := list()
	if len(names) != 2 || len(again) != 2 {
		t.Fatalf("listed %v, then %v; want the two services", names, again)
	}
	for i := range names {
		if names[i] != again[i] || unsafe.StringData(names[i]) != unsafe.StringData(again[i]) ||
			unsafe.StringData(namespaces[i]) != unsafe.StringData(againNS[i]) {
			t.Errorf("the two listings' %s/%s are two copies, want the store's one", namespaces[i], names[i])
		}
	}
}

func TestEmbeddedListEach(t *testing.T) {
	ctx := context.Background()
	cs, f, err := k8sclient.NewEmbedded(service("a"), service("b"), service("c"))
	if err != nil {
		t.Fatal(err)
	}
	gvr, gvk := corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service")
	var names []string
	rv, ok, err := k8sclient.EmbeddedListEach(cs, gvr, gvk, "", metav1.ListOptions{ResourceVersion: "0"}, func(obj runtime.Object) error {
		names = append(names, obj.(*corev1.Service).Name)
		return nil
	})
	if !ok || err != nil || rv == "" {
		t.Fatalf("EmbeddedListEach: handled %v, resource version %q, %v", ok, rv, err)
	}
	if want := []string{"a", "b", "c"}; fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("listed %v, want %v", names, want)
	}
	if n := len(f.Actions()); n != 1 || f.Actions()[0].Verb != "list" {
		t.Fatalf("recorded actions %v, want the one list", f.Actions())
	}

	if err := f.CoreV1().Services("default").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := f.CoreV1().Services("").Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	select {
	case ev := <-w.ResultChan():
		if svc, _ := ev.Object.(*corev1.Service); ev.Type != watch.Deleted || svc == nil || svc.Name != "b" {
			t.Fatalf("first event of a watch from the list: %s %#v, want DELETED b", ev.Type, ev.Object)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event from a watch from the list, want DELETED b")
	}

	stop := errors.New("stop here")
	names = nil
	_, _, err = k8sclient.EmbeddedListEach(cs, gvr, gvk, "", metav1.ListOptions{}, func(obj runtime.Object) error {
		names = append(names, obj.(*corev1.Service).Name)
		return stop
	})
	if !errors.Is(err, stop) || len(names) != 1 {
		t.Fatalf("each failing at the first object: %v after %v, want %v after one", err, names, stop)
	}

	forbidden := apierrors.NewForbidden(gvr.GroupResource(), "", errors.New("RBAC says no"))
	f.PrependReactor("list", "services", func(k8sclient.Action) (bool, runtime.Object, error) { return true, nil, forbidden })
	if _, ok, err := k8sclient.EmbeddedListEach(cs, gvr, gvk, "", metav1.ListOptions{}, func(runtime.Object) error { return nil }); !ok || !apierrors.IsForbidden(err) {
		t.Fatalf("with a reactor refusing lists: handled %v, %v; want the reactor's error", ok, err)
	}
	if _, ok, _ := k8sclient.EmbeddedListEach(cs, gvr, gvk, "", metav1.ListOptions{LabelSelector: "app=x"}, nil); ok {
		t.Error("a list with a label selector was handled")
	}
}
