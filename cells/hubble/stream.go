package hubble

import (
	"context"
	"slices"
	"time"
)

// readChunk is how many items a reader copies out of a ring at a time, so
// that writers never wait long for a reader.
const readChunk = 256

// selection is what a GetFlows or GetAgentEvents request asks of a ring:
// the last (or first) number items in a time window, and then, with
// follow, every new item until the client goes or the server stops.
type selection[T any] struct {
	// number bounds the history sent; 0 sends all of it, or none when
	// following without since.
	number uint64
	first  bool
	follow bool
	// since and until bound the items' times; zero means unbounded.
	since, until time.Time

	// timeOf is an item's time.
	timeOf func(T) time.Time
	// counts says whether an item counts towards number (lost-event records
	// do not).
	counts func(T) bool
	// wants says whether the client's filters let an item through.
	wants func(T) bool
}

// inWindow is whether t is within since and until.
func (s *selection[T]) inWindow(t time.Time) bool {
	return (s.since.IsZero() || !t.Before(s.since)) && (s.until.IsZero() || !t.After(s.until))
}

func (s *selection[T]) selects(item T) bool {
	return s.inWindow(s.timeOf(item)) && s.wants(item)
}

// history is the items of r the selection picks from what r holds now, in
// the order they were written, and the sequence number to follow from.
func (s *selection[T]) history(r *Ring[T]) ([]T, uint64) {
	oldest, next := r.Bounds()
	if s.follow && s.number == 0 && s.since.IsZero() {
		return nil, next
	}
	var (
		picked  []T
		counted uint64
		buf     = make([]T, readChunk)
	)
	full := func() bool { return s.number > 0 && counted >= s.number }
	pick := func(item T) {
		if s.selects(item) {
			picked = append(picked, item)
			if s.counts(item) {
				counted++
			}
		}
	}
	if s.first {
		for seq := oldest; seq < next && !full(); {
			first, n := r.Read(seq, buf[:min(uint64(len(buf)), next-seq)])
			if first >= next {
				break
			}
			// What was written after Bounds is the follower's.
			n = min(n, int(next-first))
			for _, item := range buf[:n] {
				if full() {
					break
				}
				pick(item)
			}
			seq = first + uint64(n)
		}
		return picked, next
	}
	// The last items: walk back from the newest until enough are picked.
	r.ScanBack(next, func(item T) bool {
		pick(item)
		return !full()
	})
	slices.Reverse(picked)
	return picked, next
}

// follower streams what is written to a ring from a sequence number on.
type follower[T any] struct {
	sel *selection[T]
	// send sends an item to the client.
	send func(T) error
	// lost tells the client that n items were overwritten before it could
	// read them.
	lost func(n uint64) error
}

// run sends the items written from seq on until ctx ends, stop is closed,
// or (with until) an item past until arrives or until passes.
func (f *follower[T]) run(ctx context.Context, r *Ring[T], seq uint64, stop <-chan struct{}) error {
	var untilPassed <-chan time.Time
	if !f.sel.until.IsZero() {
		t := time.NewTimer(time.Until(f.sel.until))
		defer t.Stop()
		untilPassed = t.C
	}
	buf := make([]T, readChunk)
	for {
		first, n := r.Read(seq, buf)
		if first > seq {
			if err := f.lost(first - seq); err != nil {
				return err
			}
		}
		for _, item := range buf[:n] {
			if !f.sel.until.IsZero() && f.sel.timeOf(item).After(f.sel.until) {
				return nil
			}
			if f.sel.selects(item) {
				if err := f.send(item); err != nil {
					return err
				}
			}
		}
		seq = first + uint64(n)
		if n > 0 {
			continue
		}
		select {
		case <-r.Wait(seq):
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
			return nil
		case <-untilPassed:
			return nil
		}
	}
}
