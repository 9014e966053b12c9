package bpfmaps

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
)

// MapOfMaps is a pinned HashOfMaps with keys of type K whose values are
// maps of the layout of its Spec.InnerMap. Like Map, it is open from its
// start hook to its stop hook and safe for concurrent use.
//
// The inner maps are not pinned: the outer map holds them. Replacing the
// map under a key is atomic for programs, which see the old map or the new
// one, so a writer fills a new inner map completely before it stores it.
type MapOfMaps[K any] struct {
	// ids is the same map seen with its values as userspace reads them:
	// the IDs of the inner maps.
	ids *Map[K, uint32]
}

// NewMapOfMaps declares a map of maps, as NewMap declares a map: call it
// from a constructor. spec.Type must be HashOfMaps and spec.InnerMap set.
//
// Opening a pin also checks the inner layout, which loading a pin does not;
// a pin whose inner maps have another layout is replaced by an empty map,
// as for any other change of layout.
func NewMapOfMaps[K any](lc cell.Lifecycle, reg *Registry, spec Spec) (*MapOfMaps[K], error) {
	if spec.Type != ebpf.HashOfMaps {
		return nil, fmt.Errorf("bpf map %s: NewMapOfMaps declares a HashOfMaps; Spec.Type is %s", spec.Name, spec.Type)
	}
	ids, err := newMap[K, uint32](lc, reg, spec)
	if err != nil {
		return nil, err
	}
	return &MapOfMaps[K]{ids: ids}, nil
}

func (m *MapOfMaps[K]) Name() string    { return m.ids.Name() }
func (m *MapOfMaps[K]) PinPath() string { return m.ids.PinPath() }
func (m *MapOfMaps[K]) Origin() Origin  { return m.ids.Origin() }

// EBPF is the open outer map, for MapReplacements; see Map.EBPF.
func (m *MapOfMaps[K]) EBPF() *ebpf.Map { return m.ids.EBPF() }

// InnerSpec is the layout of the maps this map holds.
func (m *MapOfMaps[K]) InnerSpec() InnerSpec { return *m.ids.p.spec.InnerMap }

// NewInner creates an unpinned, empty map of the inner layout, to fill and
// then Put. The caller closes it; once stored, the outer map keeps it.
func (m *MapOfMaps[K]) NewInner() (*ebpf.Map, error) {
	inner, err := ebpf.NewMap(m.ids.p.spec.InnerMap.mapSpec())
	if err != nil {
		return nil, fmt.Errorf("bpf map %s: create inner map: %w", m.Name(), err)
	}
	return inner, nil
}

// Put stores inner under key, replacing the map there, if any.
func (m *MapOfMaps[K]) Put(key K, inner *ebpf.Map) error {
	em, err := m.ids.p.acquire()
	if err != nil {
		return err
	}
	defer m.ids.p.mu.RUnlock()
	if err := em.Put(&key, inner); err != nil {
		return fmt.Errorf("bpf map %s: put: %w", m.Name(), err)
	}
	return nil
}

// Lookup opens the map stored under key; the caller closes it. A missing
// key is an error that matches ebpf.ErrKeyNotExist.
func (m *MapOfMaps[K]) Lookup(key K) (*ebpf.Map, error) {
	em, err := m.ids.p.acquire()
	if err != nil {
		return nil, err
	}
	defer m.ids.p.mu.RUnlock()
	var inner *ebpf.Map
	if err := em.Lookup(&key, &inner); err != nil {
		return nil, fmt.Errorf("bpf map %s: lookup: %w", m.Name(), err)
	}
	return inner, nil
}

// Delete removes key. A missing key is an error that matches
// ebpf.ErrKeyNotExist.
func (m *MapOfMaps[K]) Delete(key K) error { return m.ids.Delete(key) }

// Iterate calls fn with each key and the ID of the map stored there, until
// fn returns false. See Map.Iterate.
func (m *MapOfMaps[K]) Iterate(fn func(K, ebpf.MapID) bool) error {
	return m.ids.Iterate(func(key K, id uint32) bool { return fn(key, ebpf.MapID(id)) })
}
