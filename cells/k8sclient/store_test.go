package k8sclient

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

var (
	servicesGVR = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	servicesGVK = schema.GroupVersionKind{Version: "v1", Kind: "Service"}
)

func storeService(ns, name, ip string) *corev1.Service {
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}
}

// The store keeps its own copy: what a caller does to the object it wrote,
// or to one it got back, does not change the stored one; and an object
// comes back as written, TypeMeta included.
func TestStoreKeepsItsOwnCopy(t *testing.T) {
	s := newObjectStore()
	svc := storeService("default", "a", "10.96.0.1")
	if err := s.add(servicesGVR, svc, "default", false); err != nil {
		t.Fatal(err)
	}
	svc.Spec.ClusterIP = "10.96.0.99"
	got, err := s.Get(servicesGVR, "default", "a")
	if err != nil {
		t.Fatal(err)
	}
	g := got.(*corev1.Service)
	if g.Spec.ClusterIP != "10.96.0.1" || g.Labels["app"] != "a" || g.Kind != "Service" || g.APIVersion != "v1" || g.Spec.Ports[0].Port != 80 {
		t.Fatalf("stored object changed or lost fields: %+v", g)
	}
	g.Spec.ClusterIP = "10.96.0.98"
	again, _ := s.Get(servicesGVR, "default", "a")
	if ip := again.(*corev1.Service).Spec.ClusterIP; ip != "10.96.0.1" {
		t.Fatalf("changing a returned object changed the store: %s", ip)
	}
}

// Creates, updates and Delete fail as an API server's would, and a write
// into another namespace than the object's is refused.
func TestStoreWriteErrors(t *testing.T) {
	s := newObjectStore()
	if err := s.add(servicesGVR, storeService("default", "a", "10.96.0.1"), "default", true); !apierrors.IsNotFound(err) {
		t.Fatalf("update of a missing object: %v, want NotFound", err)
	}
	if err := s.add(servicesGVR, storeService("default", "a", "10.96.0.1"), "default", false); err != nil {
		t.Fatal(err)
	}
	if err := s.add(servicesGVR, storeService("default", "a", "10.96.0.2"), "default", false); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}
	if err := s.add(servicesGVR, storeService("other", "b", "10.96.0.2"), "default", false); !apierrors.IsBadRequest(err) {
		t.Fatalf("create into another namespace: %v, want BadRequest", err)
	}
	if err := s.Delete(servicesGVR, "default", "missing"); !apierrors.IsNotFound(err) {
		t.Fatalf("delete of a missing object: %v, want NotFound", err)
	}
	// An object without a namespace takes the request's; the caller's
	// object stays without.
	noNS := storeService("", "c", "10.96.0.3")
	if err := s.add(servicesGVR, noNS, "default", false); err != nil {
		t.Fatal(err)
	}
	if noNS.Namespace != "" {
		t.Fatalf("caller's object got namespace %q", noNS.Namespace)
	}
	if got, err := s.Get(servicesGVR, "default", "c"); err != nil || got.(*corev1.Service).Namespace != "default" {
		t.Fatalf("get c: %v %v", got, err)
	}
}

// A list is sorted by namespace and name, filtered by namespace, and
// carries the resource version that a watch then starts from: the watch
// first sends what was written after it.
func TestStoreListAndWatchFromVersion(t *testing.T) {
	s := newObjectStore()
	for _, svc := range []*corev1.Service{
		storeService("b", "z", "10.96.0.1"), storeService("a", "y", "10.96.0.2"), storeService("a", "x", "10.96.0.3"),
	} {
		if err := s.Add(svc); err != nil {
			t.Fatal(err)
		}
	}
	obj, err := s.List(servicesGVR, servicesGVK, "")
	if err != nil {
		t.Fatal(err)
	}
	list := obj.(*corev1.ServiceList)
	var names []string
	for _, item := range list.Items {
		names = append(names, item.Namespace+"/"+item.Name)
	}
	if want := "[a/x a/y b/z]"; fmt.Sprint(names) != want {
		t.Fatalf("list %v, want %s", names, want)
	}
	if list.Items[0].Kind != "Service" || list.Items[0].Spec.ClusterIP != "10.96.0.3" {
		t.Fatalf("list item %+v", list.Items[0])
	}
	if list.ResourceVersion != "4" {
		t.Fatalf("list resource version %q, want 4 (1 and three writes)", list.ResourceVersion)
	}
	inA, err := s.List(servicesGVR, servicesGVK, "a")
	if err != nil || len(inA.(*corev1.ServiceList).Items) != 2 {
		t.Fatalf("list of namespace a: %v %v", inA, err)
	}

	// Written after the list: sent first by a watch from its version.
	if err := s.add(servicesGVR, storeService("a", "x", "10.96.1.3"), "a", true); err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(servicesGVR, "", metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := next(t, w)
	if svc := ev.Object.(*corev1.Service); ev.Type != watch.Added || svc.Name != "x" || svc.Spec.ClusterIP != "10.96.1.3" {
		t.Fatalf("first event %s %+v, want x written since the list", ev.Type, ev.Object)
	}
	// Then every write, as it happens.
	if err := s.add(servicesGVR, storeService("b", "z", "10.96.1.1"), "b", true); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w); ev.Type != watch.Modified || ev.Object.(*corev1.Service).Spec.ClusterIP != "10.96.1.1" {
		t.Fatalf("event %s %+v, want z modified", ev.Type, ev.Object)
	}
	if err := s.Delete(servicesGVR, "a", "y"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w); ev.Type != watch.Deleted || ev.Object.(*corev1.Service).Name != "y" {
		t.Fatalf("event %s %+v, want y deleted", ev.Type, ev.Object)
	}
	// A stopped watcher gets nothing, and is forgotten.
	w.Stop()
	if err := s.add(servicesGVR, storeService("b", "z", "10.96.2.1"), "b", true); err != nil {
		t.Fatal(err)
	}
	if n := len(s.watchers[servicesGVR]); n != 0 {
		t.Fatalf("%d namespaces still have watchers after the only one stopped", n)
	}
}

func next(t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	select {
	case ev := <-w.ResultChan():
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no watch event within 10s")
		return watch.Event{}
	}
}
