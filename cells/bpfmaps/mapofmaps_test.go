package bpfmaps_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
)

// tableSpec is the inner layout of the test's map of maps: a single-entry
// array holding a table of four uint32.
var tableSpec = bpfmaps.InnerSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 1}

func tablesSpec(inner bpfmaps.InnerSpec) bpfmaps.Spec {
	return bpfmaps.Spec{Name: "cellium_tables", Type: ebpf.HashOfMaps, MaxEntries: 8, InnerMap: &inner}
}

// declareTables is a cell that declares a map of maps keyed by uint16.
func declareTables(id string, spec bpfmaps.Spec, out **bpfmaps.MapOfMaps[uint16]) cell.Cell {
	return cell.Module(id, "Test maps of maps",
		cell.Invoke(func(lc cell.Lifecycle, reg *bpfmaps.Registry) error {
			m, err := bpfmaps.NewMapOfMaps[uint16](lc, reg, spec)
			if out != nil {
				*out = m
			}
			return err
		}),
	)
}

// putTable stores table under key as a new inner map.
func putTable(t *testing.T, m *bpfmaps.MapOfMaps[uint16], key uint16, table []uint32) {
	t.Helper()
	inner, err := m.NewInner()
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if err := inner.Put(uint32(0), table); err != nil {
		t.Fatal(err)
	}
	if err := m.Put(key, inner); err != nil {
		t.Fatal(err)
	}
}

// readTable returns the table stored under key.
func readTable(t *testing.T, m *bpfmaps.MapOfMaps[uint16], key uint16, size int) []uint32 {
	t.Helper()
	inner, err := m.Lookup(key)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	table := make([]uint32, size)
	if err := inner.Lookup(uint32(0), table); err != nil {
		t.Fatal(err)
	}
	return table
}

func keys(t *testing.T, m *bpfmaps.MapOfMaps[uint16]) []uint16 {
	t.Helper()
	var got []uint16
	if err := m.Iterate(func(k uint16, id ebpf.MapID) bool {
		if id == 0 {
			t.Errorf("key %d: inner map ID 0", k)
		}
		got = append(got, k)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	return got
}

func TestMapOfMaps(t *testing.T) {
	root := bpfmapstest.Root(t)
	var tables *bpfmaps.MapOfMaps[uint16]
	stop := start(t, newHive(root, declareTables("tables", tablesSpec(tableSpec), &tables)))
	if tables.Origin() != bpfmaps.OriginCreated {
		t.Fatalf("origin %q, want %q", tables.Origin(), bpfmaps.OriginCreated)
	}
	putTable(t, tables, 7, []uint32{1, 2, 1, 2})
	putTable(t, tables, 9, []uint32{3, 3, 3, 3})
	// Replacing a table is a Put of a new inner map.
	putTable(t, tables, 7, []uint32{4, 4, 5, 5})
	if got := readTable(t, tables, 7, 4); !slices.Equal(got, []uint32{4, 4, 5, 5}) {
		t.Fatalf("table 7 = %v after replacing it, want [4 4 5 5]", got)
	}
	if err := tables.Delete(9); err != nil {
		t.Fatal(err)
	}
	if _, err := tables.Lookup(9); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("lookup of deleted key: %v, want ErrKeyNotExist", err)
	}
	if got := keys(t, tables); !slices.Equal(got, []uint16{7}) {
		t.Fatalf("keys %v, want [7]", got)
	}

	// An inner map of another layout is refused by the kernel.
	wrong, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := tables.Put(1, wrong); err == nil {
		t.Fatal("stored an inner map of another layout")
	}
	stop()

	// Restart: the pin and its tables are kept.
	stop = start(t, newHive(root, declareTables("tables", tablesSpec(tableSpec), &tables)))
	if tables.Origin() != bpfmaps.OriginReused {
		t.Fatalf("origin after restart %q, want %q", tables.Origin(), bpfmaps.OriginReused)
	}
	if got := readTable(t, tables, 7, 4); !slices.Equal(got, []uint32{4, 4, 5, 5}) {
		t.Fatalf("table 7 after restart = %v, want [4 4 5 5]", got)
	}
	stop()
}

// The kernel fixes a map of maps' inner layout, and loading a pin does not
// compare it: opening must notice a change, whether or not the pinned map
// holds any map it could look at.
func TestMapOfMapsInnerLayoutChange(t *testing.T) {
	bigger := tableSpec
	bigger.ValueSize = 32
	otherType := tableSpec
	otherType.Type = ebpf.Hash

	for _, tc := range []struct {
		name  string
		fill  bool
		inner bpfmaps.InnerSpec
	}{
		{"holding a map, table size", true, bigger},
		{"empty, table size", false, bigger},
		{"empty, inner type", false, otherType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := bpfmapstest.Root(t)
			var tables *bpfmaps.MapOfMaps[uint16]
			stop := start(t, newHive(root, declareTables("tables", tablesSpec(tableSpec), &tables)))
			if tc.fill {
				putTable(t, tables, 7, []uint32{1, 2, 3, 4})
			}
			stop()

			// The same layout again is reused, empty or not.
			stop = start(t, newHive(root, declareTables("tables", tablesSpec(tableSpec), &tables)))
			if tables.Origin() != bpfmaps.OriginReused {
				t.Fatalf("same layout: origin %q, want %q", tables.Origin(), bpfmaps.OriginReused)
			}
			stop()

			stop = start(t, newHive(root, declareTables("tables", tablesSpec(tc.inner), &tables)))
			defer stop()
			if tables.Origin() != bpfmaps.OriginRecreated {
				t.Fatalf("new inner layout: origin %q, want %q", tables.Origin(), bpfmaps.OriginRecreated)
			}
			if got := keys(t, tables); len(got) != 0 {
				t.Fatalf("keys after recreation %v, want none", got)
			}
			// The recreated map takes maps of the new layout.
			inner, err := tables.NewInner()
			if err != nil {
				t.Fatal(err)
			}
			defer inner.Close()
			if err := tables.Put(1, inner); err != nil {
				t.Fatalf("put a map of the new layout: %v", err)
			}
			if got := tables.InnerSpec(); got != tc.inner {
				t.Fatalf("InnerSpec() = %+v, want %+v", got, tc.inner)
			}
		})
	}
}
