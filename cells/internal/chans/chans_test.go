package chans

import (
	"slices"
	"testing"
)

func TestReady(t *testing.T) {
	ch := make(chan int, 10)
	for i := range 5 {
		ch <- i
	}
	var got []int
	if closed := Ready(ch, 3, func(v int) { got = append(got, v) }); closed || !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("Ready(max 3) = %v, closed %v; want 0 1 2, open", got, closed)
	}
	got = nil
	if closed := Ready(ch, 10, func(v int) { got = append(got, v) }); closed || !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("Ready with 2 queued = %v, closed %v; want 3 4 without waiting for more", got, closed)
	}
	close(ch)
	if closed := Ready(ch, 10, func(int) { t.Fatal("a value from a closed, empty channel") }); !closed {
		t.Fatal("Ready on a closed channel says open")
	}
}

// Batches yields what is queued at once, up to max, and waits for no more;
// it ends when the channel closes, after the values queued before.
func TestBatches(t *testing.T) {
	ch := make(chan int, 10)
	for i := range 5 {
		ch <- i
	}
	var got [][]int
	for b := range Batches(ch, 3) {
		got = append(got, slices.Clone(b))
		switch len(got) {
		case 2:
			ch <- 5 // arrives after the loop woke: the next batch's
		case 3:
			ch <- 6
			close(ch)
		}
	}
	want := [][]int{{0, 1, 2}, {3, 4}, {5}, {6}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("batches %v, want %v", got, want)
	}
}
