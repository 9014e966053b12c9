package lbmaps

import "fmt"

// idAllocator hands out numeric IDs in [1, max]: frontend (reverse NAT) IDs
// and backend IDs. IDs found in the pinned maps at start are reserved before
// any is allocated, so a restart reuses every ID.
type idAllocator struct {
	what string
	max  uint32
	next uint32   // lowest ID never handed out or reserved
	free []uint32 // released IDs, and gaps below next left by reserve; may hold used IDs, skipped lazily
	used []uint64 // bitmap of IDs in use: 8 KiB for 65536 IDs
}

func newIDAllocator(what string, max uint32) *idAllocator {
	return &idAllocator{what: what, max: max, next: 1, used: make([]uint64, max/64+1)}
}

func (a *idAllocator) isUsed(id uint32) bool { return a.used[id/64]&(1<<(id%64)) != 0 }
func (a *idAllocator) setUsed(id uint32)     { a.used[id/64] |= 1 << (id % 64) }
func (a *idAllocator) clearUsed(id uint32)   { a.used[id/64] &^= 1 << (id % 64) }

// reserve marks id as taken, as restored from a map.
func (a *idAllocator) reserve(id uint32) error {
	if id == 0 || id > a.max {
		return fmt.Errorf("%s ID %d out of range 1..%d", a.what, id, a.max)
	}
	if a.isUsed(id) {
		return fmt.Errorf("%s ID %d is used twice", a.what, id)
	}
	for ; a.next < id; a.next++ {
		a.free = append(a.free, a.next)
	}
	if id == a.next {
		a.next++
	}
	a.setUsed(id)
	return nil
}

// allocate returns an unused ID.
func (a *idAllocator) allocate() (uint32, error) {
	for len(a.free) > 0 {
		id := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		if !a.isUsed(id) {
			a.setUsed(id)
			return id, nil
		}
	}
	if a.next > a.max {
		return 0, fmt.Errorf("out of %s IDs: all %d are in use", a.what, a.max)
	}
	id := a.next
	a.next++
	a.setUsed(id)
	return id, nil
}

// release frees id.
func (a *idAllocator) release(id uint32) {
	if id != 0 && id <= a.max && a.isUsed(id) {
		a.clearUsed(id)
		a.free = append(a.free, id)
	}
}
