package bpfmaps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// BatchCursor is where a walk of a map with [Map.BatchLookup] is. The zero
// value starts at the first entry. A cursor walks one map, once.
type BatchCursor struct {
	c ebpf.MapBatchCursor
}

// BatchLookup reads the next entries of a walk over the map into keys and
// values, at most len(keys), and advances cursor past them. It returns how
// many it read and whether the walk is over; the last read may return
// entries and done together.
//
// A walk of a hash map goes bucket by bucket: it visits once every entry
// that stays in the map during the walk, may or may not visit entries added
// or deleted meanwhile, and may delete the entries it has visited. keys
// must have room for the fullest bucket (a few entries; 256 is plenty), or
// the error matches unix.ENOSPC. Not for per-CPU maps.
func (m *Map[K, V]) BatchLookup(cursor *BatchCursor, keys []K, values []V) (n int, done bool, err error) {
	if len(keys) == 0 || len(keys) != len(values) {
		return 0, false, fmt.Errorf("bpf map %s: batch lookup into %d keys and %d values", m.p.spec.Name, len(keys), len(values))
	}
	em, err := m.p.acquire()
	if err != nil {
		return 0, false, err
	}
	defer m.p.mu.RUnlock()
	n, err = em.BatchLookup(&cursor.c, keys, values, nil)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return n, true, nil
	}
	if err != nil {
		return n, false, fmt.Errorf("bpf map %s: batch lookup: %w", m.p.spec.Name, err)
	}
	return n, false, nil
}
