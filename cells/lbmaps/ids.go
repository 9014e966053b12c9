package lbmaps

import "fmt"

// idAllocator hands out numeric IDs in [1, max]: frontend (reverse NAT) IDs
// and backend IDs. IDs found in the pinned maps at start are reserved before
// any is allocated, so a restart reuses every ID.
type idAllocator struct {
	what string
	max  uint32
	next uint32   // lowest ID never handed out or reserved
	free []uint32 // released IDs, and gaps below next left by Reserve; may hold used IDs, skipped lazily
	used map[uint32]struct{}
}

func newIDAllocator(what string, max uint32) *idAllocator {
	return &idAllocator{what: what, max: max, next: 1, used: map[uint32]struct{}{}}
}

// reserve marks id as taken, as restored from a map.
func (a *idAllocator) reserve(id uint32) error {
	if id == 0 || id > a.max {
		return fmt.Errorf("%s ID %d out of range 1..%d", a.what, id, a.max)
	}
	if _, ok := a.used[id]; ok {
		return fmt.Errorf("%s ID %d is used twice", a.what, id)
	}
	for ; a.next < id; a.next++ {
		a.free = append(a.free, a.next)
	}
	if id == a.next {
		a.next++
	}
	a.used[id] = struct{}{}
	return nil
}

// allocate returns an unused ID.
func (a *idAllocator) allocate() (uint32, error) {
	for len(a.free) > 0 {
		id := a.free[len(a.free)-1]
		a.free = a.free[:len(a.free)-1]
		if _, ok := a.used[id]; !ok {
			a.used[id] = struct{}{}
			return id, nil
		}
	}
	if a.next > a.max {
		return 0, fmt.Errorf("out of %s IDs: all %d are in use", a.what, a.max)
	}
	id := a.next
	a.next++
	a.used[id] = struct{}{}
	return id, nil
}

// release frees id.
func (a *idAllocator) release(id uint32) {
	if _, ok := a.used[id]; ok {
		delete(a.used, id)
		a.free = append(a.free, id)
	}
}
