package bpfmaps_test

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
)

// TestBatchLookup walks hash maps in chunks: every entry once, with its
// value, also when the walk deletes what it has visited.
func TestBatchLookup(t *testing.T) {
	root := bpfmapstest.Root(t)
	var hash, lru *bpfmaps.Map[flowKey, flowStats]
	start(t, newHive(root,
		declare("flows", bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 4096}, &hash),
		declare("lru-flows", bpfmaps.Spec{Name: "cellium_lru_flows", Type: ebpf.LRUHash, MaxEntries: 4096}, &lru),
	))
	const entries = 1000
	for _, m := range []*bpfmaps.Map[flowKey, flowStats]{hash, lru} {
		for id := range uint32(entries) {
			if err := m.Put(flowKey{ID: id, Proto: 17}, flowStats{Packets: uint64(id), Bytes: 7}); err != nil {
				t.Fatal(err)
			}
		}
		for _, deleteVisited := range []bool{false, true} {
			seen := map[uint32]int{}
			var cursor bpfmaps.BatchCursor
			keys, values := make([]flowKey, 64), make([]flowStats, 64)
			for done := false; !done; {
				var n int
				var err error
				n, done, err = m.BatchLookup(&cursor, keys, values)
				if err != nil {
					t.Fatalf("%s: %v", m.Name(), err)
				}
				for i := range n {
					if values[i].Packets != uint64(keys[i].ID) || values[i].Bytes != 7 {
						t.Fatalf("%s: %v has value %+v", m.Name(), keys[i], values[i])
					}
					seen[keys[i].ID]++
				}
				if deleteVisited {
					if got, err := m.BatchDelete(keys[:n]); err != nil || got != n {
						t.Fatalf("%s: delete the %d visited entries: %d, %v", m.Name(), n, got, err)
					}
				}
			}
			if len(seen) != entries {
				t.Fatalf("%s (delete visited %v): walk saw %d entries, want %d", m.Name(), deleteVisited, len(seen), entries)
			}
			for id, times := range seen {
				if times != 1 {
					t.Fatalf("%s (delete visited %v): walk saw entry %d %d times", m.Name(), deleteVisited, id, times)
				}
			}
		}
		var cursor bpfmaps.BatchCursor
		n, done, err := m.BatchLookup(&cursor, make([]flowKey, 8), make([]flowStats, 8))
		if n != 0 || !done || err != nil {
			t.Fatalf("%s: walk of the emptied map: %d, %v, %v; want 0 entries, done", m.Name(), n, done, err)
		}
	}
}

func TestBatchLookupBuffers(t *testing.T) {
	root := bpfmapstest.Root(t)
	var m *bpfmaps.Map[flowKey, flowStats]
	stop := start(t, newHive(root, declare("flows", bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 16}, &m)))

	var cursor bpfmaps.BatchCursor
	if _, _, err := m.BatchLookup(&cursor, make([]flowKey, 2), make([]flowStats, 1)); err == nil {
		t.Error("batch lookup into 2 keys and 1 value: no error")
	}
	// 16 keys in a 16-bucket map: some bucket holds two or more (all in
	// their own bucket is one chance in a million).
	for id := range uint32(16) {
		if err := m.Put(flowKey{ID: id}, flowStats{}); err != nil {
			t.Fatal(err)
		}
	}
	tooSmall := false
	for done := false; !done; {
		var err error
		_, done, err = m.BatchLookup(&cursor, make([]flowKey, 1), make([]flowStats, 1))
		if errors.Is(err, unix.ENOSPC) {
			tooSmall = true
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !tooSmall {
		t.Error("a one-entry buffer walked a map with full buckets without ENOSPC")
	}
	stop()
	if _, _, err := m.BatchLookup(&bpfmaps.BatchCursor{}, make([]flowKey, 1), make([]flowStats, 1)); err == nil {
		t.Error("batch lookup of a closed map: no error")
	}
}

// TestIterateEveryEntryOnce: Iterate, which reads hash, LRU and array maps
// in batches, visits every entry of a map larger than a batch exactly once
// with its value, for each of those types.
func TestIterateEveryEntryOnce(t *testing.T) {
	root := bpfmapstest.Root(t)
	const entries = 10_000 // more than two batches
	var hash, lru, array *bpfmaps.Map[uint32, uint64]
	start(t, newHive(root,
		declare("hash", bpfmaps.Spec{Name: "cellium_it_hash", Type: ebpf.Hash, MaxEntries: 2 * entries}, &hash),
		declare("lru", bpfmaps.Spec{Name: "cellium_it_lru", Type: ebpf.LRUHash, MaxEntries: 2 * entries}, &lru),
		declare("array", bpfmaps.Spec{Name: "cellium_it_array", Type: ebpf.Array, MaxEntries: entries}, &array),
	))
	for _, m := range []*bpfmaps.Map[uint32, uint64]{hash, lru, array} {
		keys, values := make([]uint32, entries), make([]uint64, entries)
		for i := range keys {
			keys[i], values[i] = uint32(i), uint64(i)*3+1
		}
		if n, err := m.BatchPut(keys, values); err != nil || n != entries {
			t.Fatalf("%s: put %d entries: %d, %v", m.Name(), entries, n, err)
		}
		seen := make(map[uint32]int, entries)
		if err := m.Iterate(func(k uint32, v uint64) bool {
			if v != uint64(k)*3+1 {
				t.Fatalf("%s: entry %d has value %d, want %d", m.Name(), k, v, uint64(k)*3+1)
			}
			seen[k]++
			return true
		}); err != nil {
			t.Fatalf("%s: %v", m.Name(), err)
		}
		if len(seen) != entries {
			t.Fatalf("%s: iterate saw %d entries, want %d", m.Name(), len(seen), entries)
		}
		for k, times := range seen {
			if times != 1 {
				t.Fatalf("%s: iterate saw entry %d %d times", m.Name(), k, times)
			}
		}
	}
}

// TestBatchWriteRefused: a batch the kernel refuses before its first entry
// (a frozen map takes no writes from user space) reports none done, not
// every one: callers retry from the count, and must not skip what was not
// written.
func TestBatchWriteRefused(t *testing.T) {
	root := bpfmapstest.Root(t)
	var m *bpfmaps.Map[flowKey, flowStats]
	start(t, newHive(root, declare("flows", bpfmaps.Spec{Name: "cellium_flows", Type: ebpf.Hash, MaxEntries: 64}, &m)))
	keys := []flowKey{{ID: 1, Proto: 6}, {ID: 2, Proto: 6}, {ID: 3, Proto: 6}}
	if err := m.Put(keys[0], flowStats{Packets: 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.EBPF().Freeze(); err != nil {
		t.Skipf("cannot freeze the map: %v", err)
	}
	if n, err := m.BatchPut(keys, make([]flowStats, len(keys))); err == nil || n != 0 {
		t.Errorf("batch put into a frozen map: %d done, %v; want 0 and an error", n, err)
	}
	if n, err := m.BatchDelete(keys); err == nil || n != 0 {
		t.Errorf("batch delete from a frozen map: %d done, %v; want 0 and an error", n, err)
	}
	if _, err := m.Lookup(keys[0]); err != nil {
		t.Errorf("the entry the refused delete named: %v, want it still there", err)
	}
}
