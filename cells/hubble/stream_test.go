package hubble

import (
	"context"
	"slices"
	"testing"
	"time"
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// at is the time of item i in these tests: i seconds after epoch; a
// negative item stands for a lost-event record at -i seconds.
func at(i int) time.Time {
	if i < 0 {
		i = -i
	}
	return epoch.Add(time.Duration(i) * time.Second)
}

// intSelection selects ints by at; negative ints do not count towards number,
// as lost-event records do not; only even ints pass "filters".
func intSelection(number uint64, first, follow bool, since, until time.Time, evenOnly bool) *selection[int] {
	return &selection[int]{
		number: number, first: first, follow: follow, since: since, until: until,
		timeOf: at,
		counts: func(i int) bool { return i >= 0 },
		wants:  func(i int) bool { return !evenOnly || i%2 == 0 },
	}
}

func TestSelectionHistory(t *testing.T) {
	r := NewRing[int](8)
	// 0..9 into 8 slots: 0 and 1 are overwritten. -5 is a lost record.
	for _, i := range []int{0, 1, 2, 3, 4, -5, 6, 7, 8, 9} {
		r.Write(i)
	}
	var none time.Time
	tests := []struct {
		name string
		sel  *selection[int]
		want []int
	}{
		{"number 0: everything held", intSelection(0, false, false, none, none, false), []int{2, 3, 4, -5, 6, 7, 8, 9}},
		{"last 3", intSelection(3, false, false, none, none, false), []int{7, 8, 9}},
		{"last 5 counts flows, not lost records", intSelection(5, false, false, none, none, false), []int{4, -5, 6, 7, 8, 9}},
		{"first 2 of what is held", intSelection(2, true, false, none, none, false), []int{2, 3}},
		{"more than held", intSelection(100, false, false, none, none, false), []int{2, 3, 4, -5, 6, 7, 8, 9}},
		{"since", intSelection(0, false, false, at(7), none, false), []int{7, 8, 9}},
		{"until", intSelection(0, false, false, none, at(3), false), []int{2, 3}},
		{"since and until, inclusive", intSelection(0, false, false, at(4), at(6), false), []int{4, -5, 6}},
		{"last 2 in a window", intSelection(2, false, false, at(2), at(7), false), []int{6, 7}},
		{"first 2 in a window", intSelection(2, true, false, at(3), none, false), []int{3, 4}},
		{"filter: last 2 even", intSelection(2, false, false, none, none, true), []int{6, 8}},
		{"filter: first 2 even", intSelection(2, true, false, none, none, true), []int{2, 4}},
		{"follow without number or since: no history", intSelection(0, false, true, none, none, false), nil},
		{"follow with number: the last ones", intSelection(1, false, true, none, none, false), []int{9}},
		{"follow with since", intSelection(0, false, true, at(8), none, false), []int{8, 9}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, next := tc.sel.history(r)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("history = %v, want %v", got, tc.want)
			}
			if next != 10 {
				t.Fatalf("follow from %d, want 10 (the next write)", next)
			}
		})
	}
}

func TestFollowerReportsOverwrittenItems(t *testing.T) {
	r := NewRing[int](2)
	for i := range 5 {
		r.Write(i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got []int
	var lost uint64
	f := &follower[int]{
		sel: intSelection(0, false, true, time.Time{}, time.Time{}, false),
		send: func(i int) error {
			got = append(got, i)
			if i == 5 {
				cancel()
			}
			return nil
		},
		lost: func(n uint64) error { lost += n; return nil },
	}
	done := make(chan error)
	// Following from 0 while the ring holds 3 and 4: 0..2 were lost (or,
	// if 5 is written first, 0..3).
	go func() { done <- f.run(ctx, r, 0, nil) }()
	// Whether the follower is still reading or already waits for the next
	// write, it must send item 5.
	r.Write(5)
	if err := <-done; err != context.Canceled {
		t.Fatalf("follower ended with %v, want the context's cancellation", err)
	}
	if !(lost == 3 && slices.Equal(got, []int{3, 4, 5})) && !(lost == 4 && slices.Equal(got, []int{4, 5})) {
		t.Fatalf("follower sent %v and lost %d, want every item it did not send counted as lost, up to 5", got, lost)
	}
}

func TestFollowerStopsAtUntil(t *testing.T) {
	r := NewRing[int](4)
	r.Write(1)
	r.Write(2)
	r.Write(3)
	var got []int
	f := &follower[int]{
		sel:  intSelection(0, false, true, time.Time{}, at(2), false),
		send: func(i int) error { got = append(got, i); return nil },
		lost: func(uint64) error { return nil },
	}
	if err := f.run(context.Background(), r, 0, nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("follower with until at(2) sent %v, want [1 2] and to end at the item past until", got)
	}
}

func TestFollowerEndsWhenTheServerStops(t *testing.T) {
	r := NewRing[int](4)
	stop := make(chan struct{})
	f := &follower[int]{
		sel:  intSelection(0, false, true, time.Time{}, time.Time{}, false),
		send: func(int) error { return nil },
		lost: func(uint64) error { return nil },
	}
	done := make(chan error)
	go func() { done <- f.run(context.Background(), r, 0, stop) }()
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("follower ended with %v when the server stopped, want nil", err)
	}
}
