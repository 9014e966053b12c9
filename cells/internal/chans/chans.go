// Package chans has what the cells' event loops share for reading their
// channels in batches: a batch is the value that woke the loop and the
// ones already queued behind it, never one waited for, so a burst (a
// kvstore listing, a flood of monitor events) is applied in few write
// transactions and a lone value is applied at once.
package chans

import "iter"

// Ready hands fn, in order, up to max more values that ch holds right now,
// without waiting for any: a loop that has received one value takes the
// ones queued behind it into the same batch (one snapshot, one write
// transaction). It reports whether ch turned out closed.
func Ready[T any](ch <-chan T, max int, fn func(T)) (closed bool) {
	for range max {
		select {
		case v, ok := <-ch:
			if !ok {
				return true
			}
			fn(v)
		default:
			return false
		}
	}
	return false
}

// Batches reads ch in batches of up to max values, each the first to
// arrive and those queued behind it (see Ready). It ends when ch closes;
// the slice it yields is reused for the next batch.
func Batches[T any](ch <-chan T, max int) iter.Seq[[]T] {
	return func(yield func([]T) bool) {
		batch := make([]T, 0, max)
		for v := range ch {
			batch = append(batch[:0], v)
			closed := Ready(ch, max-1, func(v T) { batch = append(batch, v) })
			if !yield(batch) || closed {
				return
			}
		}
	}
}
