package hubble

import (
	"slices"
	"testing"
)

func TestRingKeepsTheLastCapacityItems(t *testing.T) {
	r := NewRing[int](3)
	if oldest, next := r.Bounds(); oldest != 0 || next != 0 {
		t.Fatalf("empty ring bounds = %d, %d, want 0, 0", oldest, next)
	}
	for i := range 5 {
		r.Write(i * 10)
	}
	if oldest, next := r.Bounds(); oldest != 2 || next != 5 {
		t.Fatalf("bounds after 5 writes into 3 = %d, %d, want 2, 5", oldest, next)
	}
	if r.Capacity() != 3 {
		t.Fatalf("capacity = %d, want 3", r.Capacity())
	}

	buf := make([]int, 10)
	first, n := r.Read(0, buf)
	if first != 2 || !slices.Equal(buf[:n], []int{20, 30, 40}) {
		t.Fatalf("Read(0) = first %d, %v; want the overwritten items skipped: first 2, [20 30 40]", first, buf[:n])
	}
	first, n = r.Read(3, buf[:1])
	if first != 3 || !slices.Equal(buf[:n], []int{30}) {
		t.Fatalf("Read(3) into 1 slot = first %d, %v; want 3, [30]", first, buf[:n])
	}
	if first, n = r.Read(5, buf); first != 5 || n != 0 {
		t.Fatalf("Read(next) = first %d, %d items; want 5, none", first, n)
	}
}

func TestRingScanBack(t *testing.T) {
	r := NewRing[int](4)
	for i := range 6 {
		r.Write(i)
	}
	var seen []int
	exhausted := r.ScanBack(6, func(i int) bool { seen = append(seen, i); return true })
	if !exhausted || !slices.Equal(seen, []int{5, 4, 3, 2}) {
		t.Fatalf("ScanBack over all = %v (exhausted %v), want newest first [5 4 3 2], exhausted", seen, exhausted)
	}
	seen = nil
	exhausted = r.ScanBack(5, func(i int) bool { seen = append(seen, i); return i > 3 })
	if exhausted || !slices.Equal(seen, []int{4, 3}) {
		t.Fatalf("ScanBack from 5 stopping at 3 = %v (exhausted %v), want [4 3], not exhausted", seen, exhausted)
	}
}

func TestRingScanBackAcrossChunks(t *testing.T) {
	r := NewRing[int](3 * readChunk)
	for i := range 4 * readChunk {
		r.Write(i)
	}
	want := 4*readChunk - 1
	r.ScanBack(4*readChunk, func(i int) bool {
		if i != want {
			t.Fatalf("ScanBack visited %d, want %d", i, want)
		}
		want--
		return true
	})
	if want != readChunk-1 {
		t.Fatalf("ScanBack stopped before %d, want it to reach the oldest held item %d", want+1, readChunk)
	}
}

func TestRingWaitWakesOnWrite(t *testing.T) {
	r := NewRing[int](2)
	r.Write(1)
	select {
	case <-r.Wait(0):
	default:
		t.Fatal("Wait for a written item is not closed")
	}
	wait := r.Wait(1)
	select {
	case <-wait:
		t.Fatal("Wait for the next item is closed before it is written")
	default:
	}
	if r.Wait(1) != wait {
		t.Fatal("two waiters for the same write got different channels")
	}
	r.Write(2)
	select {
	case <-wait:
	default:
		t.Fatal("Wait for the next item is not closed after the write")
	}
}
