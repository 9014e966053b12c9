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
