package hubble

import "sync"

// Ring keeps the last Capacity items written to it. Every item gets a
// sequence number, the count of items written before it, so a reader that
// remembers where it stopped knows on its next read how many items were
// overwritten in between. Writers never wait for readers.
type Ring[T any] struct {
	mu      sync.Mutex
	items   []T
	written uint64
	// wake is closed by the next Write once a reader asked to wait for it.
	wake chan struct{}
}

// NewRing makes a ring of capacity items; capacity must be positive.
func NewRing[T any](capacity int) *Ring[T] {
	return &Ring[T]{items: make([]T, capacity)}
}

// Write adds item, overwriting the oldest one when the ring is full.
func (r *Ring[T]) Write(item T) {
	r.mu.Lock()
	r.items[r.written%uint64(len(r.items))] = item
	r.written++
	wake := r.wake
	r.wake = nil
	r.mu.Unlock()
	if wake != nil {
		close(wake)
	}
}

// Capacity is the number of items the ring keeps.
func (r *Ring[T]) Capacity() int { return len(r.items) }

// Bounds are the sequence numbers of the oldest item held and of the next
// item to be written; the ring holds next-oldest items, and next is the
// number of items ever written.
func (r *Ring[T]) Bounds() (oldest, next uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bounds()
}

func (r *Ring[T]) bounds() (oldest, next uint64) {
	if c := uint64(len(r.items)); r.written > c {
		return r.written - c, r.written
	}
	return 0, r.written
}

// Read copies the items from sequence number from on into buf, as many as
// fit and are written, and returns the sequence number of the first item
// copied and how many were copied. first is greater than from when the
// items from there on were already overwritten.
func (r *Ring[T]) Read(from uint64, buf []T) (first uint64, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	oldest, next := r.bounds()
	first = max(from, oldest)
	for seq := first; seq < next && n < len(buf); seq++ {
		buf[n] = r.items[seq%uint64(len(r.items))]
		n++
	}
	return first, n
}

// ScanBack calls fn on the items written before sequence number next,
// newest first, until fn returns false or no older item is held. It says
// whether it ran out of items. Items written meanwhile are not visited;
// old ones they overwrite meanwhile are not either.
func (r *Ring[T]) ScanBack(next uint64, fn func(T) bool) (exhausted bool) {
	buf := make([]T, min(next, readChunk))
	for hi := next; hi > 0; {
		lo := hi - min(hi, uint64(len(buf)))
		first, n := r.Read(lo, buf[:hi-lo])
		if first >= hi {
			return true
		}
		// Items overwritten since the caller's Bounds shift what Read
		// copies: keep only those before hi.
		n = min(n, int(hi-first))
		for i := n - 1; i >= 0; i-- {
			if !fn(buf[i]) {
				return false
			}
		}
		if first > lo {
			return true
		}
		hi = lo
	}
	return true
}

// Wait returns a channel that is closed once the item with sequence number
// seq may have been written: at once if it is, else at the next Write.
// Readers that follow the ring wait for the next sequence number to read.
func (r *Ring[T]) Wait(seq uint64) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq < r.written {
		return closedChan
	}
	if r.wake == nil {
		r.wake = make(chan struct{})
	}
	return r.wake
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()
