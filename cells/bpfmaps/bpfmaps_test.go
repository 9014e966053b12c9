package bpfmaps_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
)

type flowKey struct {
	ID    uint32
	Proto uint8
	_     [3]byte
}

func (k flowKey) String() string { return fmt.Sprintf("flow %d/%d", k.ID, k.Proto) }

type flowStats struct {
	Packets uint64
	Bytes   uint64
}

// newHive is the bpf-maps cell with --bpf-root at root, plus cells.
func newHive(root string, cells ...cell.Cell) *hive.Hive {
	h := hive.New(append([]cell.Cell{bpfmaps.Cell}, cells...)...)
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	return h
}

// declare is a cell that declares one map and hands it to the test.
func declare[K, V any](id string, spec bpfmaps.Spec, out **bpfmaps.Map[K, V]) cell.Cell {
	return cell.Module(id, "Test maps",
		cell.Invoke(func(lc cell.Lifecycle, reg *bpfmaps.Registry) error {
			m, err := bpfmaps.NewMap[K, V](lc, reg, spec)
			if out != nil {
				*out = m
			}
			return err
		}),
	)
}

// start starts h and returns the function that stops it, which also runs
// when the test ends if the test did not call it.
func start(t *testing.T, h *hive.Hive) (stop func()) {
	t.Helper()
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := h.Stop(log, context.Background()); err != nil {
				t.Errorf("stop hive: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatalf("map info: %v", err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("kernel reports no map ID")
	}
	return id
}

func TestCreateThenReuse(t *testing.T) {
	root := bpfmapstest.Root(t)
	spec := bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 16}

	var flows *bpfmaps.Map[flowKey, flowStats]
	stop := start(t, newHive(root, declare("flows", spec, &flows)))

	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil || uint32(st.Type) != unix.BPF_FS_MAGIC {
		t.Fatalf("--bpf-root %s is not a mounted bpffs after start (statfs type %#x, err %v)", root, st.Type, err)
	}
	fi, err := os.Stat(filepath.Join(root, "cellium"))
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("pin directory: %v, %v; want a directory with mode 0700", fi, err)
	}
	if got := flows.Origin(); got != bpfmaps.OriginCreated {
		t.Fatalf("origin of a new map = %q, want %q", got, bpfmaps.OriginCreated)
	}
	if want := filepath.Join(root, "cellium", "cellium_flows"); flows.PinPath() != want {
		t.Fatalf("pin path = %s, want %s", flows.PinPath(), want)
	}

	for id := uint32(1); id <= 3; id++ {
		if err := flows.Put(flowKey{ID: id, Proto: 6}, flowStats{Packets: uint64(id), Bytes: 100 * uint64(id)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := flows.Delete(flowKey{ID: 2, Proto: 6}); err != nil {
		t.Fatal(err)
	}
	if _, err := flows.Lookup(flowKey{ID: 2, Proto: 6}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("lookup of deleted key: err = %v, want ErrKeyNotExist", err)
	}
	if err := flows.Delete(flowKey{ID: 2, Proto: 6}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("delete of missing key: err = %v, want ErrKeyNotExist", err)
	}
	want := map[flowKey]flowStats{
		{ID: 1, Proto: 6}: {Packets: 1, Bytes: 100},
		{ID: 3, Proto: 6}: {Packets: 3, Bytes: 300},
	}
	assertEntries(t, flows, want)
	firstID := mapID(t, flows.EBPF())

	stop()
	if err := flows.Put(flowKey{ID: 9}, flowStats{}); err == nil || !strings.Contains(err.Error(), "not open") {
		t.Fatalf("put after stop: err = %v, want a not-open error", err)
	}
	if flows.EBPF() != nil {
		t.Fatal("EBPF() after stop is not nil")
	}
	if _, err := os.Stat(flows.PinPath()); err != nil {
		t.Fatalf("pin gone after stop: %v", err)
	}

	// A second run over the same bpffs, as after an agent restart.
	var again *bpfmaps.Map[flowKey, flowStats]
	start(t, newHive(root, declare("flows", spec, &again)))
	if got := again.Origin(); got != bpfmaps.OriginReused {
		t.Fatalf("origin after restart = %q, want %q", got, bpfmaps.OriginReused)
	}
	if id := mapID(t, again.EBPF()); id != firstID {
		t.Fatalf("map ID after restart = %d, want the pinned map's %d", id, firstID)
	}
	assertEntries(t, again, want)
}

func assertEntries(t *testing.T, m *bpfmaps.Map[flowKey, flowStats], want map[flowKey]flowStats) {
	t.Helper()
	got := map[flowKey]flowStats{}
	if err := m.Iterate(func(k flowKey, v flowStats) bool {
		got[k] = v
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("entries = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("entries = %v, want %v", got, want)
		}
		if lv, err := m.Lookup(k); err != nil || lv != v {
			t.Fatalf("lookup %v = %v, %v; want %v", k, lv, err, v)
		}
	}
}

func TestIterateStopsEarly(t *testing.T) {
	root := bpfmapstest.Root(t)
	var m *bpfmaps.Map[uint32, uint64]
	start(t, newHive(root, declare("counts", bpfmaps.Spec{Name: "counts", Type: ebpf.Hash, MaxEntries: 8}, &m)))
	for k := range uint32(5) {
		if err := m.Put(k, uint64(k)); err != nil {
			t.Fatal(err)
		}
	}
	calls := 0
	err := m.Iterate(func(uint32, uint64) bool {
		calls++
		return calls < 2
	})
	if err != nil || calls != 2 {
		t.Fatalf("iterate that stops at the second entry: %d calls, err %v; want 2 calls, no error", calls, err)
	}
}

// opened is what a run found when it opened a map.
type opened struct {
	origin  bpfmaps.Origin
	id      ebpf.MapID
	hasKey1 bool
}

// openOnce runs a hive that declares a map with keys uint32, values V and
// the given spec, notes what it found, puts value at key 1 if value is not
// nil, and stops.
func openOnce[V any](t *testing.T, root string, spec bpfmaps.Spec, value *V) opened {
	t.Helper()
	var m *bpfmaps.Map[uint32, V]
	stop := start(t, newHive(root, declare("counts", spec, &m)))
	defer stop()
	_, err := m.Lookup(1)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	o := opened{origin: m.Origin(), id: mapID(t, m.EBPF()), hasKey1: err == nil}
	if value != nil {
		if err := m.Put(1, *value); err != nil {
			t.Fatal(err)
		}
	}
	return o
}

func TestRecreateOnLayoutChange(t *testing.T) {
	old := bpfmaps.Spec{Name: "cellium_counts", Type: ebpf.Hash, MaxEntries: 16}
	withMaxEntries, withType, withFlags := old, old, old
	withMaxEntries.MaxEntries = 32
	withType.Type = ebpf.LRUHash
	withFlags.Flags = unix.BPF_F_NO_PREALLOC

	for _, tc := range []struct {
		name string
		// reopen opens the map with the changed layout.
		reopen func(t *testing.T, root string) opened
		// want is the layout the pin must hold afterwards.
		want ebpf.MapSpec
		// keeps: the old map's entry is copied (only MaxEntries changed).
		keeps bool
	}{
		{
			name:   "value type",
			reopen: func(t *testing.T, root string) opened { return openOnce[flowStats](t, root, old, nil) },
			want:   ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 16, MaxEntries: 16},
		},
		{
			name:   "max entries",
			reopen: func(t *testing.T, root string) opened { return openOnce[uint64](t, root, withMaxEntries, nil) },
			want:   ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 32},
			keeps:  true,
		},
		{
			name:   "map type",
			reopen: func(t *testing.T, root string) opened { return openOnce[uint64](t, root, withType, nil) },
			want:   ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: 4, ValueSize: 8, MaxEntries: 16},
		},
		{
			name:   "flags",
			reopen: func(t *testing.T, root string) opened { return openOnce[uint64](t, root, withFlags, nil) },
			want:   ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16, Flags: unix.BPF_F_NO_PREALLOC},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := bpfmapstest.Root(t)
			value := uint64(100)
			first := openOnce(t, root, old, &value)
			if first.origin != bpfmaps.OriginCreated {
				t.Fatalf("first run: origin %q, want %q", first.origin, bpfmaps.OriginCreated)
			}

			changed := tc.reopen(t, root)
			if changed.origin != bpfmaps.OriginRecreated {
				t.Fatalf("after the layout change: origin %q, want %q", changed.origin, bpfmaps.OriginRecreated)
			}
			if changed.hasKey1 != tc.keeps {
				t.Fatalf("after the layout change: the old map's entry there %v, want %v", changed.hasKey1, tc.keeps)
			}
			if changed.id == first.id {
				t.Fatalf("after the layout change: still the old map (ID %d)", first.id)
			}

			pin := filepath.Join(root, "cellium", old.Name)
			pinned, err := ebpf.LoadPinnedMap(pin, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer pinned.Close()
			got := ebpf.MapSpec{Type: pinned.Type(), KeySize: pinned.KeySize(), ValueSize: pinned.ValueSize(),
				MaxEntries: pinned.MaxEntries(), Flags: pinned.Flags()}
			if got.String() != tc.want.String() {
				t.Fatalf("pin %s holds %s, want %s", pin, got.String(), tc.want.String())
			}
			if id := mapID(t, pinned); id != changed.id {
				t.Fatalf("pin holds map %d, want the recreated map %d", id, changed.id)
			}

			// The new layout is now the pinned one: the next run reuses it.
			if again := tc.reopen(t, root); again.origin != bpfmaps.OriginReused || again.id != changed.id {
				t.Fatalf("run after the recreation: origin %q, map %d; want %q, map %d",
					again.origin, again.id, bpfmaps.OriginReused, changed.id)
			}
		})
	}
}

// TestRecreateCopiesEntriesOnSizeChange: a pin whose map differs in
// MaxEntries alone is replaced by a map holding its entries, as many as
// fit: programs attached before the owner writes its desired state find
// what the old map held (a policy map replaced empty denied every new
// connection of an isolated endpoint).
func TestRecreateCopiesEntriesOnSizeChange(t *testing.T) {
	for _, typ := range []ebpf.MapType{ebpf.Hash, ebpf.LRUHash} {
		t.Run(typ.String(), func(t *testing.T) {
			root := bpfmapstest.Root(t)
			spec := bpfmaps.Spec{Name: "cellium_sized", Type: typ, MaxEntries: 8}
			run := func(max uint32, fill bool) (bpfmaps.Origin, map[uint32]uint64) {
				t.Helper()
				spec := spec
				spec.MaxEntries = max
				var m *bpfmaps.Map[uint32, uint64]
				stop := start(t, newHive(root, declare("sized", spec, &m)))
				defer stop()
				if fill {
					for k := range uint32(8) {
						if err := m.Put(k, uint64(k)*100+1); err != nil {
							t.Fatal(err)
						}
					}
				}
				got := map[uint32]uint64{}
				if err := m.Iterate(func(k uint32, v uint64) bool { got[k] = v; return true }); err != nil {
					t.Fatal(err)
				}
				return m.Origin(), got
			}
			if origin, got := run(8, true); origin != bpfmaps.OriginCreated || len(got) != 8 {
				t.Fatalf("first run: origin %q, %d entries; want created, 8", origin, len(got))
			}
			origin, got := run(16, false)
			if origin != bpfmaps.OriginRecreated || len(got) != 8 {
				t.Fatalf("grown to 16: origin %q, entries %v; want recreated with the 8 old ones", origin, got)
			}
			for k, v := range got {
				if v != uint64(k)*100+1 {
					t.Fatalf("grown to 16: key %d holds %d, want %d", k, v, uint64(k)*100+1)
				}
			}
			// Shrunk: as many as fit (an LRU hash may hold fewer: it
			// evicts per CPU before it is full).
			origin, got = run(4, false)
			if origin != bpfmaps.OriginRecreated || len(got) == 0 || len(got) > 4 {
				t.Fatalf("shrunk to 4: origin %q, entries %v; want recreated with up to 4 of the old ones", origin, got)
			}
			if typ == ebpf.Hash && len(got) != 4 {
				t.Fatalf("shrunk to 4: %d entries, want 4", len(got))
			}
			for k, v := range got {
				if v != uint64(k)*100+1 {
					t.Fatalf("shrunk to 4: key %d holds %d, want %d", k, v, uint64(k)*100+1)
				}
			}
		})
	}
}
