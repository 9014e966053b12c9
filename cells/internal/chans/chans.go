// Package chans has what the cells' event loops share for reading their
// channels in batches.
package chans

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
