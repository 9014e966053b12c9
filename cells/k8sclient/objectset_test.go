package k8sclient

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// An objectSet gives back the manifest set for each key, also for keys
// whose hashes collide, lists every manifest once, and after deletes (of
// the key in byHash or of one in collided) keeps finding the others.
func TestObjectSet(t *testing.T) {
	// One is kept per object of the directory: 64 bytes is an allocation
	// class, one more byte is 80.
	if size := unsafe.Sizeof(manifest{}); size != 64 {
		t.Errorf("a manifest is %d bytes, want 64", size)
	}
	services := typeOf(corev1.SchemeGroupVersion.WithResource("services"), "Service")
	endpointSlices := typeOf(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), "EndpointSlice")
	t.Run("collide=false", func(t *testing.T) { testHashedSet(t, newObjectSet(), services, endpointSlices, false) })
	t.Run("collide=true", func(t *testing.T) { testHashedSet(t, newHashedSet[lenHash](), services, endpointSlices, true) })
}

// lenHash has three hashes for many keys: most keys collide.
type lenHash struct{}

func (lenHash) hash(k objectKey) uint64 { return uint64(len(k.name) % 3) }

func testHashedSet[H keyHasher](t *testing.T, s hashedSet[H], services, endpointSlices *objectType, collide bool) {
	want := map[objectKey]*manifest{}
	for i := range 20 {
		for _, typ := range []*objectType{services, endpointSlices} {
			m := &manifest{key: objectKey{objectType: typ, namespace: "shop", name: fmt.Sprintf("web-%d", i)}, digest: uint64(i)}
			s.set(m)
			want[m.key] = m
		}
	}
	check := func(what string) {
		t.Helper()
		for k, m := range want {
			if got := s.get(k); got != m {
				t.Fatalf("%s: get %s = %v, want %v", what, k, got, m)
			}
		}
		gone := objectKey{objectType: services, namespace: "shop", name: "web-x"}
		if want[gone] == nil && s.get(gone) != nil {
			t.Fatalf("%s: %s found, never set", what, gone)
		}
		listed := map[objectKey]*manifest{}
		for m := range s.all() {
			if listed[m.key] != nil {
				t.Fatalf("%s: %s listed twice", what, m.key)
			}
			listed[m.key] = m
		}
		if !maps.Equal(listed, want) || s.len() != len(want) {
			t.Fatalf("%s: all() listed %d manifests, len() %d, want %d", what, len(listed), s.len(), len(want))
		}
	}
	check("after set")
	if collide && len(s.collided) == 0 {
		t.Fatal("no key went to collided: the test does not test collisions")
	}

	// A newer manifest of a key replaces the older, wherever it is.
	for k := range want {
		m := &manifest{key: k, digest: 100}
		s.set(m)
		want[k] = m
	}
	check("after replacing each")

	keys := slices.SortedFunc(maps.Keys(want), func(a, b objectKey) int { return cmp.Compare(a.String(), b.String()) })
	for i, k := range keys {
		if i%2 == 1 {
			continue
		}
		s.delete(k)
		delete(want, k)
		check("after delete " + k.String())
	}
	s.delete(objectKey{objectType: services, namespace: "shop", name: "never"})
	check("after deleting a key never set")

	// Setting the keys left again replaces them: no key is held
	// twice (a delete keeps a colliding key findable where a set
	// looks for it).
	for k := range want {
		m := &manifest{key: k, digest: 200}
		s.set(m)
		want[k] = m
	}
	check("after replacing each again")
}
