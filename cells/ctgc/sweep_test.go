package ctgc

import (
	"testing"

	"github.com/cellium/cellium/pkg/ctmap"
)

// TestSweepAllocatesPerWalkNotPerEntry: a sweep's allocations (the
// goroutine that deletes, its channels, the system calls' own) do not grow
// with the entries it reads and deletes: a walk of 4000 entries allocates
// what a walk of 40 does, both in one chunk.
func TestSweepAllocatesPerWalkNotPerEntry(t *testing.T) {
	_, m := startGC(t, 8192)
	bufs := newBuffers[ctmap.Key4, ctmap.Entry](4096)
	allocs := func(entries int) float64 {
		keys, values := make([]ctmap.Key4, entries), make([]ctmap.Entry, entries)
		for i := range entries {
			keys[i] = ctmap.Key4{SrcAddr: [4]byte{10, 244, byte(i >> 8), byte(i)}, Proto: 6}
		}
		return testing.AllocsPerRun(20, func() {
			if _, err := m.BatchPut(keys, values); err != nil {
				t.Fatal(err)
			}
			// Lifetime 0 has expired: the sweep deletes every entry.
			j := &judge{now: ctmap.Now()}
			s, err := sweep(walk[ctmap.Key4, ctmap.Entry]{m: m, bufs: bufs, verdict: j.verdict4}, j, nil)
			if err != nil || s.Scanned != entries || s.Deleted[expired] != entries {
				t.Fatalf("sweep of %d entries: %+v, %v", entries, s, err)
			}
		})
	}
	few, many := allocs(40), allocs(4000)
	t.Logf("allocations of a sweep: %v with 40 entries, %v with 4000", few, many)
	if many > few+2 {
		t.Errorf("a sweep of 4000 entries allocates %v times, one of 40 %v: want no allocation per entry", many, few)
	}
}

// TestSweepConfirmKeepsRefreshedEntries: with confirm, an entry the walk
// condemned is deleted only if confirm, reading the map again, still says
// so: one the datapath refreshed or gave to a new connection in between
// stays. The walk here condemns every entry, as if it had read them all
// expired; confirm reads the live ones back.
func TestSweepConfirmKeepsRefreshedEntries(t *testing.T) {
	_, m := startGC(t, 8192)
	now := ctmap.Now()
	keys, values := make([]ctmap.Key4, 100), make([]ctmap.Entry, 100)
	for i := range keys {
		keys[i] = ctmap.Key4{SrcAddr: [4]byte{10, 244, 0, byte(i)}, Proto: 6}
		values[i].Lifetime = now + 3600
		if i%4 == 0 {
			values[i].Lifetime = now - 1
		}
	}
	if _, err := m.BatchPut(keys, values); err != nil {
		t.Fatal(err)
	}
	j := &judge{now: now}
	w := walk[ctmap.Key4, ctmap.Entry]{
		m: m, bufs: newBuffers[ctmap.Key4, ctmap.Entry](16),
		verdict: func(*ctmap.Key4, *ctmap.Entry) reason { return expired },
		confirm: func(k ctmap.Key4) bool {
			e, err := m.Lookup(k)
			return err == nil && j.verdict(&e) == expired
		},
	}
	s, err := sweep(w, j, nil)
	if err != nil || s.Scanned != 100 || s.Deleted[expired] != 25 {
		t.Fatalf("sweep: %+v, %v; want 100 scanned, 25 deleted", s, err)
	}
	for i, k := range keys {
		_, err := m.Lookup(k)
		if gone := err != nil; gone != (i%4 == 0) {
			t.Errorf("entry %d (lifetime %d, now %d): gone %v (%v)", i, values[i].Lifetime, now, gone, err)
		}
	}
}
