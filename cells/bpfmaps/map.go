package bpfmaps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sync"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Spec describes a map: what the kernel needs to create it, less the key
// and value sizes, which come from the Go types given to [NewMap].
type Spec struct {
	// Name is the pin's file name and the name given to the kernel. It is
	// lower-case letters, digits and '_', at most [MaxNameLen] characters.
	// The kernel keeps only the first 15 characters (bpftool shows those);
	// the pin keeps the full name.
	Name       string
	Type       ebpf.MapType
	MaxEntries uint32
	// Flags are the BPF_F_* map creation flags, e.g. BPF_F_NO_PREALLOC.
	Flags uint32
	// InnerMap is, for a HashOfMaps, the layout of the maps it holds: the
	// kernel fixes it when it creates the map and refuses to store a map
	// of another layout. Declare such a map with [NewMapOfMaps].
	InnerMap *InnerSpec
}

// InnerSpec is the layout of the maps a map of maps holds.
type InnerSpec struct {
	Type       ebpf.MapType
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
	Flags      uint32
}

// MaxNameLen is the longest map name a Spec may have.
const MaxNameLen = 64

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

func (s Spec) validate() error {
	if len(s.Name) > MaxNameLen || !nameRE.MatchString(s.Name) {
		return fmt.Errorf("invalid bpf map name %q: want lower-case letters, digits and '_', starting with a letter, at most %d characters", s.Name, MaxNameLen)
	}
	if s.Type == ebpf.UnspecifiedMap {
		return fmt.Errorf("bpf map %s: Spec.Type is not set", s.Name)
	}
	if s.MaxEntries == 0 {
		return fmt.Errorf("bpf map %s: Spec.MaxEntries is 0", s.Name)
	}
	if s.Type == ebpf.ArrayOfMaps {
		return fmt.Errorf("bpf map %s: ArrayOfMaps is not supported, declare a HashOfMaps", s.Name)
	}
	if (s.Type == ebpf.HashOfMaps) != (s.InnerMap != nil) {
		return fmt.Errorf("bpf map %s: Spec.InnerMap is for a HashOfMaps, and a HashOfMaps needs one", s.Name)
	}
	if in := s.InnerMap; in != nil {
		if in.Type == ebpf.UnspecifiedMap || in.Type == ebpf.HashOfMaps || in.Type == ebpf.ArrayOfMaps {
			return fmt.Errorf("bpf map %s: InnerMap.Type %s: want the type of a map that holds data", s.Name, in.Type)
		}
		if in.KeySize == 0 || in.ValueSize == 0 || in.MaxEntries == 0 {
			return fmt.Errorf("bpf map %s: InnerMap needs a KeySize, ValueSize and MaxEntries", s.Name)
		}
	}
	return nil
}

func (in *InnerSpec) mapSpec() *ebpf.MapSpec {
	return &ebpf.MapSpec{
		Type:       in.Type,
		KeySize:    in.KeySize,
		ValueSize:  in.ValueSize,
		MaxEntries: in.MaxEntries,
		Flags:      in.Flags,
	}
}

// compatible checks that outer, a pinned map of maps, holds maps of this
// layout. The kernel reports no inner layout, so compare a map that outer
// holds or, when it holds none, offer it one under a missing key with
// BPF_EXIST: the kernel checks the layout (EINVAL) before it finds the key
// missing (ENOENT), so the offer changes nothing either way.
func (in *InnerSpec) compatible(outer *ebpf.Map) error {
	key := make([]byte, outer.KeySize())
	err := outer.NextKey(nil, key)
	if err == nil {
		var inner *ebpf.Map
		if err := outer.Lookup(key, &inner); err != nil {
			return fmt.Errorf("open an inner map: %w", err)
		}
		defer inner.Close()
		got := InnerSpec{inner.Type(), inner.KeySize(), inner.ValueSize(), inner.MaxEntries(), inner.Flags()}
		if got != *in {
			return fmt.Errorf("InnerMap: %+v changed to %+v: %w", got, *in, ebpf.ErrMapIncompatible)
		}
		return nil
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	probe, err := ebpf.NewMap(in.mapSpec())
	if err != nil {
		return fmt.Errorf("create an inner map: %w", err)
	}
	defer probe.Close()
	err = outer.Update(key, probe, ebpf.UpdateExist)
	switch {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return nil
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("InnerMap: the pinned map holds maps of another layout than %+v: %w", *in, ebpf.ErrMapIncompatible)
	case err == nil:
		return errors.New("probe the inner layout: an entry appeared while the map was being opened")
	}
	return fmt.Errorf("probe the inner layout: %w", err)
}

// Origin says how a map was opened at start.
type Origin string

const (
	// OriginCreated: there was no pin, the map is new and empty.
	OriginCreated Origin = "created"
	// OriginReused: a pin with the same layout was there, left by an
	// earlier run; its entries are kept.
	OriginReused Origin = "reused"
	// OriginRecreated: a pin with another layout was there; it was replaced
	// by a new map, empty, or holding the old one's entries (as many as
	// fit) when only MaxEntries differed (and the type copies entry by
	// entry: hash, LRU hash, LPM trie, array).
	OriginRecreated Origin = "recreated"
)

// Map is a pinned map with keys of type K and values of type V. It is open
// from its start hook to its stop hook; outside that its methods return an
// error. It is safe for concurrent use.
type Map[K, V any] struct {
	p *pinnedMap
}

// NewMap declares a map. Call it from a constructor with the constructor's
// lifecycle: it validates the spec, registers the name and appends the hook
// that opens the map, and does no I/O itself.
//
// The key and value sizes are those of K and V, which must have a fixed
// size (binary.Size) and no implicit padding, so that their layout is the
// C one: add explicit `_ [n]byte` fields where C pads.
//
// At start the map is opened from its pin under <bpf-root>/<prefix>/, or
// created and pinned. A pin whose layout (type, key and value size, max
// entries, flags) differs from the spec is replaced by a new map: its
// entries are lost, and a warning says what changed. At stop the map is
// closed and its pin kept, so programs keep using it while the agent is
// down and the next run finds its entries.
func NewMap[K, V any](lc cell.Lifecycle, reg *Registry, spec Spec) (*Map[K, V], error) {
	if spec.Type == ebpf.HashOfMaps {
		return nil, fmt.Errorf("bpf map %s: declare a HashOfMaps with NewMapOfMaps", spec.Name)
	}
	return newMap[K, V](lc, reg, spec)
}

func newMap[K, V any](lc cell.Lifecycle, reg *Registry, spec Spec) (*Map[K, V], error) {
	keySize, err := fixedSize[K]()
	if err != nil {
		return nil, fmt.Errorf("bpf map %s: key: %w", spec.Name, err)
	}
	valueSize, err := fixedSize[V]()
	if err != nil {
		return nil, fmt.Errorf("bpf map %s: value: %w", spec.Name, err)
	}
	p, err := reg.declare(spec, keySize, valueSize)
	if err != nil {
		return nil, err
	}
	m := &Map[K, V]{p: p}
	p.dump = m.dump
	lc.Append(p)
	return m, nil
}

// dump decodes up to limit entries (all if limit is 0) with the key and
// value types' own formatting, and says whether there were more.
func (m *Map[K, V]) dump(limit int) (entries []apiv1.MapEntry, truncated bool, err error) {
	em, err := m.p.acquire()
	if err != nil {
		return nil, false, err
	}
	it := em.Iterate()
	var key K
	if m.p.spec.Type == ebpf.PerCPUHash || m.p.spec.Type == ebpf.PerCPUArray || m.p.spec.Type == ebpf.LRUCPUHash {
		var values []V
		for it.Next(&key, &values) {
			if limit > 0 && len(entries) == limit {
				truncated = true
				break
			}
			entries = append(entries, apiv1.MapEntry{Key: fmt.Sprint(key), Value: fmt.Sprint(values)})
		}
	} else {
		var value V
		for it.Next(&key, &value) {
			if limit > 0 && len(entries) == limit {
				truncated = true
				break
			}
			entries = append(entries, apiv1.MapEntry{Key: fmt.Sprint(key), Value: fmt.Sprint(value)})
		}
	}
	m.p.mu.RUnlock()
	if err := it.Err(); err != nil {
		return nil, false, fmt.Errorf("bpf map %s: dump: %w", m.p.spec.Name, err)
	}
	return entries, truncated, nil
}

// fixedSize is the size of T in a map, which is the size the kernel expects.
func fixedSize[T any]() (uint32, error) {
	var zero T
	typ := reflect.TypeFor[T]()
	n := binary.Size(zero)
	if n < 0 {
		return 0, fmt.Errorf("type %s has no fixed size: use fixed-size integers, arrays and structs of them", typ)
	}
	if pad := int(unsafe.Sizeof(zero)) - n; pad != 0 {
		return 0, fmt.Errorf("type %s has %d bytes of implicit padding: add explicit _ [n]byte fields so that its layout matches C", typ, pad)
	}
	return uint32(n), nil
}

// Name is the map's name, as in its Spec.
func (m *Map[K, V]) Name() string { return m.p.spec.Name }

// PinPath is where the map is pinned.
func (m *Map[K, V]) PinPath() string { return m.p.pinPath() }

// Origin says how the map was opened; it is empty before start.
func (m *Map[K, V]) Origin() Origin {
	m.p.mu.RLock()
	defer m.p.mu.RUnlock()
	return m.p.origin
}

// EBPF is the open map, to hand to programs through
// ebpf.CollectionOptions.MapReplacements; nil when the map is not open. A
// program loaded with it holds its own reference, so it keeps the map after
// the stop hook closes this one.
func (m *Map[K, V]) EBPF() *ebpf.Map {
	m.p.mu.RLock()
	defer m.p.mu.RUnlock()
	return m.p.m
}

// Put creates or updates an entry.
func (m *Map[K, V]) Put(key K, value V) error {
	em, err := m.p.acquire()
	if err != nil {
		return err
	}
	defer m.p.mu.RUnlock()
	if err := em.Put(&key, &value); err != nil {
		return fmt.Errorf("bpf map %s: put: %w", m.p.spec.Name, err)
	}
	return nil
}

// Lookup returns the value of key. A missing key is an error that matches
// ebpf.ErrKeyNotExist.
func (m *Map[K, V]) Lookup(key K) (V, error) {
	var value V
	em, err := m.p.acquire()
	if err != nil {
		return value, err
	}
	defer m.p.mu.RUnlock()
	if err := em.Lookup(&key, &value); err != nil {
		return value, fmt.Errorf("bpf map %s: lookup: %w", m.p.spec.Name, err)
	}
	return value, nil
}

// NextKey returns the key that follows key in the map's own order, and
// false after the last one. In a hash map, a key that is no longer there
// is followed by the map's first key (the kernel's rule), so a walk
// resumed from a deleted key starts over: it may repeat entries, never
// skip one.
func (m *Map[K, V]) NextKey(key K) (next K, ok bool, err error) {
	em, err := m.p.acquire()
	if err != nil {
		return next, false, err
	}
	defer m.p.mu.RUnlock()
	err = em.NextKey(&key, &next)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return next, false, nil
	}
	if err != nil {
		return next, false, fmt.Errorf("bpf map %s: next key: %w", m.p.spec.Name, err)
	}
	return next, true, nil
}

// LookupPerCPU returns the values of key on every possible CPU, for
// per-CPU maps, whose V is the value of one CPU.
func (m *Map[K, V]) LookupPerCPU(key K) ([]V, error) {
	em, err := m.p.acquire()
	if err != nil {
		return nil, err
	}
	defer m.p.mu.RUnlock()
	var values []V
	if err := em.Lookup(&key, &values); err != nil {
		return nil, fmt.Errorf("bpf map %s: lookup: %w", m.p.spec.Name, err)
	}
	return values, nil
}

// Delete removes key. A missing key is an error that matches
// ebpf.ErrKeyNotExist.
func (m *Map[K, V]) Delete(key K) error {
	em, err := m.p.acquire()
	if err != nil {
		return err
	}
	defer m.p.mu.RUnlock()
	if err := em.Delete(&key); err != nil {
		return fmt.Errorf("bpf map %s: delete: %w", m.p.spec.Name, err)
	}
	return nil
}

// BatchPut writes keys[i] = values[i] for each i in one system call. It
// returns how many leading entries were written: on error, entry n failed
// or was not tried, and the entries after it were not tried.
func (m *Map[K, V]) BatchPut(keys []K, values []V) (n int, err error) {
	if len(keys) != len(values) {
		return 0, fmt.Errorf("bpf map %s: batch put of %d keys and %d values", m.p.spec.Name, len(keys), len(values))
	}
	if len(keys) == 0 {
		return 0, nil
	}
	em, err := m.p.acquire()
	if err != nil {
		return 0, err
	}
	defer m.p.mu.RUnlock()
	n, err = em.BatchUpdate(keys, values, nil)
	if err != nil {
		return doneBefore(n, len(keys)), fmt.Errorf("bpf map %s: batch put: %w", m.p.spec.Name, err)
	}
	return n, nil
}

// BatchDelete removes keys in one system call. It returns how many leading
// keys were removed: on error, key n failed (a missing key matches
// ebpf.ErrKeyNotExist) and the keys after it were not tried.
func (m *Map[K, V]) BatchDelete(keys []K) (n int, err error) {
	if len(keys) == 0 {
		return 0, nil
	}
	em, err := m.p.acquire()
	if err != nil {
		return 0, err
	}
	defer m.p.mu.RUnlock()
	n, err = em.BatchDelete(keys, nil)
	if err != nil {
		return doneBefore(n, len(keys)), fmt.Errorf("bpf map %s: batch delete: %w", m.p.spec.Name, err)
	}
	return n, nil
}

// doneBefore is how many of a failed batch's entries were done, from the
// count the kernel gave back. The kernel writes the count only once it
// has gone through entries: an error before the first (a frozen map's
// EPERM) leaves the count as it was given, every entry, though none was
// done. A failed batch has at least one entry not done.
func doneBefore(count, entries int) int {
	if count >= entries {
		return 0
	}
	return count
}

// Iterate calls fn for each entry until fn returns false, and returns the
// error that ended the iteration early, if any. fn may update the map;
// deleting keys of a hash map while iterating may visit keys twice. Not for
// per-CPU maps.
//
// Hash, LRU hash and array maps are read in batches (one system call per
// iterateChunk entries instead of two per entry: restoring 100,000
// load-balancing entries took 0.3 s of system calls one by one); other
// types, and kernels without batch lookups, key by key.
func (m *Map[K, V]) Iterate(fn func(K, V) bool) error {
	switch m.p.spec.Type {
	case ebpf.Hash, ebpf.LRUHash, ebpf.Array:
		err := m.iterateBatches(fn)
		if !errors.Is(err, errNoBatches) {
			return err
		}
	}
	return m.iterateKeys(fn)
}

// Prune deletes the entries whose key want rejects, for a reconciler's
// Prune. done, if not nil, is called with each such key and the outcome of
// its delete: nil when the key is gone (also when it went before); what
// done returns is joined into Prune's error. Without done, failed deletes
// are joined as they are. A failed delete does not stop the others.
func (m *Map[K, V]) Prune(want func(K) bool, done func(K, error) error) error {
	var stale []K
	if err := m.Iterate(func(k K, _ V) bool {
		if !want(k) {
			stale = append(stale, k)
		}
		return true
	}); err != nil {
		return err
	}
	var errs []error
	for _, k := range stale {
		err := m.Delete(k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
		if done != nil {
			err = done(k, err)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// iterateChunk is how many entries Iterate reads per batch at most: far
// more than a hash bucket ever holds (a batch must take a whole bucket).
// iterateChunkBytes bounds the batch's buffers for large entries.
const (
	iterateChunk      = 4096
	iterateChunkBytes = 1 << 20
)

var errNoBatches = errors.New("batch lookups not supported")

// batchLen is how many entries a batched walk of a map reads per system
// call: iterateChunk, fewer for large entries (iterateChunkBytes), never
// more than the map holds, and at least 64.
func batchLen(keySize, valueSize, maxEntries uint32) int {
	n := min(iterateChunk, iterateChunkBytes/int(keySize+valueSize), int(maxEntries))
	return max(n, 64)
}

// iterateBatches is Iterate in batches; errNoBatches if the kernel has no
// batch lookup for the map, before fn was called.
func (m *Map[K, V]) iterateBatches(fn func(K, V) bool) error {
	n := batchLen(m.p.keySize, m.p.valueSize, m.p.spec.MaxEntries)
	keys, values := make([]K, n), make([]V, n)
	var cursor BatchCursor
	for first := true; ; first = false {
		n, done, err := m.BatchLookup(&cursor, keys, values)
		if err != nil {
			if first && errors.Is(err, ebpf.ErrNotSupported) {
				return errNoBatches
			}
			return fmt.Errorf("bpf map %s: iterate: %w", m.p.spec.Name, err)
		}
		for i := range n {
			if !fn(keys[i], values[i]) {
				return nil
			}
		}
		if done {
			return nil
		}
	}
}

// iterateKeys is Iterate key by key.
func (m *Map[K, V]) iterateKeys(fn func(K, V) bool) error {
	em, err := m.p.acquire()
	if err != nil {
		return err
	}
	it := em.Iterate()
	m.p.mu.RUnlock()
	var (
		key   K
		value V
	)
	for {
		// Hold the lock for each step but not across fn, which may call
		// the map's methods.
		if _, err := m.p.acquire(); err != nil {
			return err
		}
		more := it.Next(&key, &value)
		m.p.mu.RUnlock()
		if !more {
			break
		}
		if !fn(key, value) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("bpf map %s: iterate: %w", m.p.spec.Name, err)
	}
	return nil
}

// pinnedMap is the untyped part of a Map: its spec, its pin and, while the
// agent runs, the open map. It is the lifecycle hook that opens and closes
// the map.
type pinnedMap struct {
	log       *slog.Logger
	reg       *Registry
	dir       string
	spec      Spec
	keySize   uint32
	valueSize uint32

	// mu is held for reading by every map operation and for writing to
	// open or close the map, so the stop hook never closes the map under
	// an operation.
	mu     sync.RWMutex
	m      *ebpf.Map
	origin Origin

	// dump decodes the entries with the typed Map's K and V.
	dump func(limit int) ([]apiv1.MapEntry, bool, error)
}

var _ cell.HookDescriptiveInterface = (*pinnedMap)(nil)

func (p *pinnedMap) HookInfo() string { return "bpf map " + p.spec.Name }

func (p *pinnedMap) pinPath() string { return filepath.Join(p.dir, p.spec.Name) }

func (p *pinnedMap) ebpfSpec() *ebpf.MapSpec {
	spec := &ebpf.MapSpec{
		Name:       p.spec.Name,
		Type:       p.spec.Type,
		KeySize:    p.keySize,
		ValueSize:  p.valueSize,
		MaxEntries: p.spec.MaxEntries,
		Flags:      p.spec.Flags,
		Pinning:    ebpf.PinByName,
	}
	if p.spec.InnerMap != nil {
		spec.InnerMap = p.spec.InnerMap.mapSpec()
	}
	return spec
}

// Start opens the pinned map, or creates and pins it. See NewMap.
func (p *pinnedMap) Start(cell.HookContext) error {
	pin := p.pinPath()
	opts := ebpf.MapOptions{PinPath: p.dir}

	origin := OriginCreated
	if _, err := os.Lstat(pin); err == nil {
		origin = OriginReused
	}
	m, err := ebpf.NewMapWithOptions(p.ebpfSpec(), opts)
	if err == nil && origin == OriginReused && p.spec.InnerMap != nil {
		// Loading a pin compares everything but the inner layout.
		if err = p.spec.InnerMap.compatible(m); err != nil {
			m.Close()
		}
	}
	var old *ebpf.Map
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Only the size changed (--policy-map-max, say): the old map's
		// entries are copied into the new one, as many as fit, so that
		// programs attached before the owner writes its desired state do
		// not find it empty (a policy map empty denies every new
		// connection; an enforcement map empty opens every endpoint).
		old = p.sizeChangedOnly(pin)
		what := "replacing it with an empty one"
		if old != nil {
			defer old.Close()
			what = fmt.Sprintf("replacing it with one of %d entries holding the old one's (%d entries)", p.spec.MaxEntries, old.MaxEntries())
		}
		p.log.Warn("Pinned BPF map has another layout, "+what,
			"name", p.spec.Name, "pin", pin, "difference", err)
		if err := os.Remove(pin); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("bpf map %s: remove pin with another layout: %w", p.spec.Name, err)
		}
		origin = OriginRecreated
		m, err = ebpf.NewMapWithOptions(p.ebpfSpec(), opts)
	}
	if err != nil {
		return fmt.Errorf("bpf map %s (pin %s): %w", p.spec.Name, pin, err)
	}
	if old != nil {
		p.copyFrom(old, m)
	}

	if origin == OriginCreated {
		p.reg.CreatedPin(pin)
	}
	p.mu.Lock()
	p.m, p.origin = m, origin
	p.mu.Unlock()
	p.log.Info("Opened BPF map", "name", p.spec.Name, "pin", pin, "origin", origin)
	return nil
}

// sizeChangedOnly opens the pin at pin if its map differs from p's spec in
// its MaxEntries alone, and is of a type whose entries copy one by one
// (not per-CPU, not a map of maps); else nil.
func (p *pinnedMap) sizeChangedOnly(pin string) *ebpf.Map {
	switch p.spec.Type {
	case ebpf.Hash, ebpf.LRUHash, ebpf.LPMTrie, ebpf.Array:
	default:
		return nil
	}
	old, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		return nil
	}
	if old.Type() != p.spec.Type || old.KeySize() != p.keySize || old.ValueSize() != p.valueSize ||
		old.Flags() != p.spec.Flags || old.MaxEntries() == p.spec.MaxEntries {
		old.Close()
		return nil
	}
	return old
}

// copyFrom copies the entries of old, a map of another size, into m, as
// many as fit, and logs how many were copied and how many did not fit.
func (p *pinnedMap) copyFrom(old, m *ebpf.Map) {
	key, value := make([]byte, p.keySize), make([]byte, p.valueSize)
	copied, dropped := 0, 0
	var lastErr error
	it := old.Iterate()
	for it.Next(&key, &value) {
		if err := m.Put(key, value); err != nil {
			dropped++
			lastErr = err
			continue
		}
		copied++
	}
	if err := it.Err(); err != nil {
		p.log.Warn("Could not read all the entries of the replaced BPF map", "name", p.spec.Name, "copied", copied, "error", err)
	}
	if dropped > 0 {
		p.log.Warn("Entries of the replaced BPF map did not fit in the new one: they are not in the datapath until their owner writes them again",
			"name", p.spec.Name, "copied", copied, "not_copied", dropped, "max_entries", p.spec.MaxEntries, "error", lastErr)
		return
	}
	p.log.Info("Copied the entries of the replaced BPF map into the new one", "name", p.spec.Name, "copied", copied)
}

// Stop closes the map and leaves the pin: see NewMap.
func (p *pinnedMap) Stop(cell.HookContext) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		return nil
	}
	err := p.m.Close()
	p.m = nil
	if err != nil {
		return fmt.Errorf("bpf map %s: close: %w", p.spec.Name, err)
	}
	return nil
}

// acquire returns the open map with p.mu held for reading; the caller
// releases it. It fails, without the lock, when the map is not open.
func (p *pinnedMap) acquire() (*ebpf.Map, error) {
	p.mu.RLock()
	if p.m == nil {
		p.mu.RUnlock()
		return nil, fmt.Errorf("bpf map %s is not open", p.spec.Name)
	}
	return p.m, nil
}

// describe is the map as GET /v1/maps shows it.
func (p *pinnedMap) describe() apiv1.Map {
	out := apiv1.Map{
		Name:       p.spec.Name,
		PinPath:    p.pinPath(),
		Type:       p.spec.Type.String(),
		KeySize:    p.keySize,
		ValueSize:  p.valueSize,
		MaxEntries: p.spec.MaxEntries,
		Flags:      p.spec.Flags,
		Entries:    -1,
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	out.Origin = string(p.origin)
	if p.m == nil {
		out.Error = "not open"
		return out
	}
	n, err := countEntries(p.m)
	if err != nil {
		out.Error = fmt.Sprintf("count entries: %v", err)
		return out
	}
	out.Entries = n
	return out
}

// countEntries counts the keys of m. Every index of an array exists, so an
// array has as many entries as it has room for. A hash map's are read a
// batch at a time where the kernel can (countBatched), other maps' key by
// key.
func countEntries(m *ebpf.Map) (int, error) {
	switch m.Type() {
	case ebpf.Array, ebpf.PerCPUArray:
		return int(m.MaxEntries()), nil
	case ebpf.Hash, ebpf.LRUHash:
		if n, err := countBatched(m); err == nil {
			return n, nil
		}
		// A kernel without batch operations: key by key.
	}
	var (
		cursor any // nil asks for the first key
		key    = make([]byte, m.KeySize())
		next   = make([]byte, m.KeySize())
	)
	// A hash map restarts the walk when the cursor's key is deleted under
	// it: stop after MaxEntries keys rather than walk forever.
	for n := 0; n < int(m.MaxEntries()); n++ {
		err := m.NextKey(cursor, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
		key, next = next, key
		cursor = key
	}
	return int(m.MaxEntries()), nil
}

// countBatched counts the entries of a hash map a batch at a time
// (batchLen, as Iterate):
// walking 100,000 keys one system call each took ~0.16 s, a tenth of an
// agent's restart at 50,000 Services whenever its map list was asked for.
func countBatched(m *ebpf.Map) (int, error) {
	n := batchLen(m.KeySize(), m.ValueSize(), m.MaxEntries())
	buffer := func(size uint32) any {
		t := reflect.SliceOf(reflect.ArrayOf(int(size), reflect.TypeFor[byte]()))
		return reflect.MakeSlice(t, n, n).Interface()
	}
	keys, values := buffer(m.KeySize()), buffer(m.ValueSize())
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
