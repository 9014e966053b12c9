package k8sclient

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/cellium/cellium/pkg/kubeclient"
)

// objectStore is the embedded API server's store, in the manner of
// client-go's fake object tracker: it keeps each object in its protobuf
// encoding (JSON for a kind without one) and decodes a fresh copy for every
// get, list and watch event.
//
// client-go's own tracker keeps every object as a typed Go value, about
// 1.3 KB for a small Service; encoded it is a fifth of that. Its other
// behaviour is kept: a resource version per resource, bumped by every
// write and not written into the objects; lists sorted by namespace and
// name, their resource version the resource's; a watch from a resource
// version first sends the objects written since; a watcher's buffer of 100
// events (the watchHub relays from it).
type objectStore struct {
	mu       sync.RWMutex
	objects  map[schema.GroupVersionResource]map[types.NamespacedName]storedObject
	versions map[schema.GroupVersionResource]int64
	watchers map[schema.GroupVersionResource]map[string][]*watch.RaceFreeFakeWatcher
	// kinds interns what each stored object's decoding needs;
	// encodedKinds are those of objects written by putEncoded.
	kinds        map[storedKind]*storedKind
	encodedKinds map[schema.GroupVersionKind]*storedKind
}

// storedObject is one object: its encoding and the resource version of
// the write that stored it.
type storedObject struct {
	version int64
	kind    *storedKind
	data    []byte
}

// storedKind is the Go type of an object and the TypeMeta it was written
// with (often empty for an object from a typed client), and whether its
// encoding is protobuf.
type storedKind struct {
	typ   reflect.Type
	meta  metav1.TypeMeta
	proto bool
}

type protoMarshaler interface{ Marshal() ([]byte, error) }
type protoUnmarshaler interface{ Unmarshal([]byte) error }

func newObjectStore() *objectStore {
	return &objectStore{
		objects:      map[schema.GroupVersionResource]map[types.NamespacedName]storedObject{},
		versions:     map[schema.GroupVersionResource]int64{},
		watchers:     map[schema.GroupVersionResource]map[string][]*watch.RaceFreeFakeWatcher{},
		kinds:        map[storedKind]*storedKind{},
		encodedKinds: map[schema.GroupVersionKind]*storedKind{},
	}
}

// encode is obj's stored form. s.mu is held.
func (s *objectStore) encode(obj runtime.Object) (storedObject, error) {
	k := storedKind{typ: reflect.TypeOf(obj)}
	if tm, ok := obj.GetObjectKind().(*metav1.TypeMeta); ok {
		k.meta = *tm
	} else {
		k.meta.APIVersion, k.meta.Kind = obj.GetObjectKind().GroupVersionKind().ToAPIVersionAndKind()
	}
	data, proto, err := encodeObject(obj)
	if err != nil {
		return storedObject{}, fmt.Errorf("encode %T: %w", obj, err)
	}
	k.proto = proto
	return storedObject{kind: s.intern(k), data: data}, nil
}

func (s *objectStore) intern(k storedKind) *storedKind {
	kind := s.kinds[k]
	if kind == nil {
		kind = &k
		s.kinds[k] = kind
	}
	return kind
}

// encodeObject is an object's protobuf encoding, which every built-in kind
// has, or else its JSON; proto says which.
func encodeObject(obj runtime.Object) (data []byte, proto bool, err error) {
	if isProto(obj) {
		data, err = obj.(protoMarshaler).Marshal()
		return data, true, err
	}
	data, err = json.Marshal(obj)
	return data, false, err
}

func isProto(obj runtime.Object) bool {
	_, m := obj.(protoMarshaler)
	_, u := obj.(protoUnmarshaler)
	return m && u
}

// decodeEncoded decodes what encodeObject gave for an object of kind gvk,
// setting its TypeMeta to gvk.
func decodeEncoded(gvk schema.GroupVersionKind, data []byte) (runtime.Object, error) {
	obj, err := kubeclient.Scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	if isProto(obj) {
		err = obj.(protoUnmarshaler).Unmarshal(data)
	} else {
		err = json.Unmarshal(data, obj)
	}
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", gvk.Kind, err)
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return obj, nil
}

// putEncoded creates or replaces the object ns/name of gvr, of kind gvk,
// given as encodeObject encoded it, with gvk as its TypeMeta: what a
// manifest was decoded to. The caller vouches that data is the encoding of
// an object of that kind, namespace and name.
func (s *objectStore) putEncoded(gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, ns, name string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	kind := s.encodedKinds[gvk]
	if kind == nil {
		obj, err := kubeclient.Scheme.New(gvk)
		if err != nil {
			return err
		}
		k := storedKind{typ: reflect.TypeOf(obj), proto: isProto(obj)}
		k.meta.APIVersion, k.meta.Kind = gvk.ToAPIVersionAndKind()
		kind = s.intern(k)
		s.encodedKinds[gvk] = kind
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	_, exists := s.objects[gvr][key]
	return s.store(gvr, key, storedObject{kind: kind, data: data}, exists)
}

// decodeInto fills obj, a zero value of the stored object's type.
func (o storedObject) decodeInto(obj runtime.Object) error {
	var err error
	if o.kind.proto {
		err = obj.(protoUnmarshaler).Unmarshal(o.data)
	} else {
		err = json.Unmarshal(o.data, obj)
	}
	if err != nil {
		return fmt.Errorf("decode stored %s: %w", o.kind.typ, err)
	}
	if tm, ok := obj.GetObjectKind().(*metav1.TypeMeta); ok {
		*tm = o.kind.meta
	}
	return nil
}

func (o storedObject) decode() (runtime.Object, error) {
	obj, ok := reflect.New(o.kind.typ.Elem()).Interface().(runtime.Object)
	if !ok {
		return nil, fmt.Errorf("stored type %s is not an object", o.kind.typ)
	}
	return obj, o.decodeInto(obj)
}

func (s *objectStore) Add(obj runtime.Object) error {
	if meta.IsListType(obj) {
		items, err := meta.ExtractList(obj)
		if err != nil {
			return err
		}
		for _, item := range items {
			if err := s.Add(item); err != nil {
				return err
			}
		}
		return nil
	}
	acc, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	gvr, _, err := ResourceOf(obj)
	if err != nil {
		return err
	}
	return s.add(gvr, obj, acc.GetNamespace(), false)
}

func (s *objectStore) Get(gvr schema.GroupVersionResource, ns, name string) (runtime.Object, error) {
	s.mu.RLock()
	stored, ok := s.objects[gvr][types.NamespacedName{Namespace: ns, Name: name}]
	s.mu.RUnlock()
	if !ok {
		return nil, apierrors.NewNotFound(gvr.GroupResource(), name)
	}
	obj, err := stored.decode()
	if err != nil {
		return nil, err
	}
	if status, ok := obj.(*metav1.Status); ok && status.Status != metav1.StatusSuccess {
		return nil, &apierrors.StatusError{ErrStatus: *status}
	}
	return obj, nil
}

func (s *objectStore) List(gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, ns string) (runtime.Object, error) {
	listGVK := gvk
	listGVK.Kind += "List"
	if listGVK.Version == "" {
		listGVK.Version = runtime.APIVersionInternal
	}
	list, err := kubeclient.Scheme.New(listGVK)
	if err != nil {
		return nil, err
	}
	if !meta.IsListType(list) {
		return nil, fmt.Errorf("%q is not a list type", listGVK.Kind)
	}
	listMeta, err := meta.ListAccessor(list)
	if err != nil {
		return nil, err
	}
	itemsPtr, err := meta.GetItemsPtr(list)
	if err != nil {
		return nil, err
	}

	s.mu.RLock()
	defer s.mu.RUnlock()
	listMeta.SetResourceVersion(strconv.FormatInt(s.version(gvr), 10))
	matching := s.matching(gvr, ns, 0)
	// Decoded straight into the list's items, where their element type
	// is the stored objects' (a typed list); else through SetList.
	items := reflect.ValueOf(itemsPtr).Elem()
	if items.Kind() == reflect.Slice && len(matching) > 0 && reflect.PointerTo(items.Type().Elem()) == matching[0].obj.kind.typ {
		items.Set(reflect.MakeSlice(items.Type(), len(matching), len(matching)))
		for i, m := range matching {
			if m.obj.kind.typ != matching[0].obj.kind.typ {
				return nil, fmt.Errorf("%s holds objects of types %s and %s", gvr, matching[0].obj.kind.typ, m.obj.kind.typ)
			}
			if err := m.obj.decodeInto(items.Index(i).Addr().Interface().(runtime.Object)); err != nil {
				return nil, err
			}
		}
		return list, nil
	}
	objs := make([]runtime.Object, len(matching))
	for i, m := range matching {
		if objs[i], err = m.obj.decode(); err != nil {
			return nil, err
		}
	}
	if err := meta.SetList(list, objs); err != nil {
		return nil, err
	}
	return list, nil
}

// snapshot is what List lists, not decoded: gvr's resource version and
// its objects in ns ("" for all), sorted by namespace and name.
func (s *objectStore) snapshot(gvr schema.GroupVersionResource, ns string) (int64, []matchingObject) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.version(gvr), s.matching(gvr, ns, 0)
}

// matchingObject is a stored object with its key.
type matchingObject struct {
	key types.NamespacedName
	obj storedObject
}

// matching are the objects of gvr in ns ("" for all) written after
// version, sorted by namespace and name. s.mu is held.
func (s *objectStore) matching(gvr schema.GroupVersionResource, ns string, version int64) []matchingObject {
	var out []matchingObject
	if version == 0 {
		out = make([]matchingObject, 0, len(s.objects[gvr]))
	}
	for key, obj := range s.objects[gvr] {
		if (ns == "" || key.Namespace == ns) && obj.version > version {
			out = append(out, matchingObject{key, obj})
		}
	}
	slices.SortFunc(out, func(a, b matchingObject) int {
		if c := strings.Compare(a.key.Namespace, b.key.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.key.Name, b.key.Name)
	})
	return out
}

// version is gvr's resource version: 1 before any write. s.mu is held.
func (s *objectStore) version(gvr schema.GroupVersionResource) int64 {
	if v, ok := s.versions[gvr]; ok {
		return v
	}
	return 1
}

// Watch watches gvr in ns. With options, the objects written after their
// resource version (all for none) are sent first, as ADDED.
func (s *objectStore) Watch(gvr schema.GroupVersionResource, ns string, opts ...metav1.ListOptions) (watch.Interface, error) {
	if len(opts) > 1 {
		return nil, fmt.Errorf("at most one option, got %d", len(opts))
	}
	existing, from := false, int64(0)
	if len(opts) == 1 {
		existing = true
		if rv := opts[0].ResourceVersion; rv != "" {
			v, err := strconv.ParseInt(rv, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("invalid ResourceVersion %q in ListOptions, must be int64: %w", rv, err)
			}
			from = v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := watch.NewRaceFreeFake()
	if s.watchers[gvr] == nil {
		s.watchers[gvr] = map[string][]*watch.RaceFreeFakeWatcher{}
	}
	s.watchers[gvr][ns] = append(s.watchers[gvr][ns], w)
	if existing {
		for _, m := range s.matching(gvr, ns, from) {
			obj, err := m.obj.decode()
			if err != nil {
				return nil, err
			}
			w.Add(obj)
		}
	}
	return w, nil
}

func (s *objectStore) Delete(gvr schema.GroupVersionResource, ns, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := types.NamespacedName{Namespace: ns, Name: name}
	stored, ok := s.objects[gvr][key]
	if !ok {
		return apierrors.NewNotFound(gvr.GroupResource(), name)
	}
	delete(s.objects[gvr], key)
	return s.notify(gvr, ns, watch.Deleted, stored)
}

// add stores obj, a new object or (replace) one in place of the stored one.
func (s *objectStore) add(gvr schema.GroupVersionResource, obj runtime.Object, ns string, replace bool) error {
	acc, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	if acc.GetNamespace() == "" && ns != "" {
		// Stored with the request's namespace; the caller's object stays
		// as it is.
		obj = obj.DeepCopyObject()
		acc, _ = meta.Accessor(obj)
		acc.SetNamespace(ns)
	}
	if acc.GetNamespace() != ns {
		return apierrors.NewBadRequest(fmt.Sprintf("request namespace does not match object namespace, request: %q object: %q", ns, acc.GetNamespace()))
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	key := types.NamespacedName{Namespace: ns, Name: acc.GetName()}
	_, exists := s.objects[gvr][key]
	switch {
	case exists && !replace:
		return apierrors.NewAlreadyExists(gvr.GroupResource(), key.Name)
	case !exists && replace:
		return apierrors.NewNotFound(gvr.GroupResource(), key.Name)
	}
	stored, err := s.encode(obj)
	if err != nil {
		return err
	}
	return s.store(gvr, key, stored, exists)
}

// store stores an object, in place of the one that exists. s.mu is held.
func (s *objectStore) store(gvr schema.GroupVersionResource, key types.NamespacedName, stored storedObject, exists bool) error {
	version := s.version(gvr) + 1
	s.versions[gvr] = version
	stored.version = version
	if s.objects[gvr] == nil {
		s.objects[gvr] = map[types.NamespacedName]storedObject{}
	}
	s.objects[gvr][key] = stored
	event := watch.Added
	if exists {
		event = watch.Modified
	}
	return s.notify(gvr, key.Namespace, event, stored)
}

// notify sends every watcher of the object's namespace, and of all
// namespaces, its own copy of it. s.mu is held.
func (s *objectStore) notify(gvr schema.GroupVersionResource, ns string, event watch.EventType, stored storedObject) error {
	byNamespace := s.watchers[gvr]
	if byNamespace == nil {
		return nil
	}
	// Stopped watchers are forgotten here, so that they do not pile up.
	for _, n := range []string{ns, metav1.NamespaceAll} {
		if ws := slices.DeleteFunc(byNamespace[n], (*watch.RaceFreeFakeWatcher).IsStopped); len(ws) > 0 {
			byNamespace[n] = ws
		} else {
			delete(byNamespace, n)
		}
	}
	watchers := byNamespace[ns]
	if ns != metav1.NamespaceAll {
		watchers = append(slices.Clip(watchers), byNamespace[metav1.NamespaceAll]...)
	}
	for _, w := range watchers {
		obj, err := stored.decode()
		if err != nil {
			return err
		}
		switch event {
		case watch.Added:
			w.Add(obj)
		case watch.Modified:
			w.Modify(obj)
		case watch.Deleted:
			w.Delete(obj)
		}
	}
	return nil
}
