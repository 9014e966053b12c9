package lbmaps

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/cells/bpfmaps"
)

// puts collects the writes of a reconciliation round to one map, so that
// they go to the kernel in one system call. Each write belongs to a batch
// entry (a frontend) and carries a mark, which the flush hands to its
// record function with the value once the kernel has the write; a write that fails is
// retried alone, so its error lands on its own frontend and the others go
// on. The slices are kept from round to round, up to keptWrites: a round
// allocates nothing once they have grown to its size.
type puts[K, V any] struct {
	keys    []K
	values  []V
	entries []*entry
	marks   []mark
}

// mark is whose state a write changes once the kernel has it: the
// frontend or backend written, and for a slot its number (what a slot
// points at, or a master entry holds, is the written value). A value, not
// a closure: a round writes hundreds of thousands of them.
type mark struct {
	fs   *frontendState
	bs   *backendState
	slot int
}

func (p *puts[K, V]) add(e *entry, k K, v V, m mark) {
	p.keys = append(p.keys, k)
	p.values = append(p.values, v)
	p.entries = append(p.entries, e)
	p.marks = append(p.marks, m)
}

func (p *puts[K, V]) flush(m *bpfmaps.Map[K, V], c *counters, record func(mark, V)) {
	for start := 0; start < len(p.keys); {
		n, err := m.BatchPut(p.keys[start:], p.values[start:])
		for i := start; i < start+n; i++ {
			record(p.marks[i], p.values[i])
		}
		c.wrote(m.Name(), n)
		start += n
		if err == nil {
			break
		}
		// Entry start failed or was not tried: try it alone for its own
		// error, then go on with the rest.
		if err := m.Put(p.keys[start], p.values[start]); err != nil {
			p.entries[start].fail(err)
		} else {
			c.wrote(m.Name(), 1)
			record(p.marks[start], p.values[start])
		}
		start++
	}
	p.reset()
}

// keptWrites is how many writes a round's buffers keep room for between
// rounds. A reconciliation round has at most 1,000 frontends (statedb's
// default round size); a prune after a restart can plan 100,000s of
// deletes at once, whose buffers are let go.
const keptWrites = 4096

// reset empties p for the next round, keeping its slices' capacity unless
// it is above keptWrites, and dropping the pointers they held.
func (p *puts[K, V]) reset() {
	if cap(p.keys) > keptWrites {
		*p = puts[K, V]{}
		return
	}
	clear(p.entries)
	clear(p.marks)
	p.keys, p.values, p.entries, p.marks = p.keys[:0], p.values[:0], p.entries[:0], p.marks[:0]
}

// deletes is puts for deletions. Deleting a key that is already gone
// succeeds: the kernel state is what was wanted.
type deletes[K, V any] struct {
	keys    []K
	entries []*entry
	marks   []mark
}

func (d *deletes[K, V]) add(e *entry, k K, m mark) {
	d.keys = append(d.keys, k)
	d.entries = append(d.entries, e)
	d.marks = append(d.marks, m)
}

func (d *deletes[K, V]) flush(m *bpfmaps.Map[K, V], c *counters, record func(mark)) {
	for start := 0; start < len(d.keys); {
		n, err := m.BatchDelete(d.keys[start:])
		for i := start; i < start+n; i++ {
			record(d.marks[i])
		}
		c.deleted(m.Name(), n)
		start += n
		if err == nil {
			break
		}
		if err := m.Delete(d.keys[start]); err == nil {
			c.deleted(m.Name(), 1)
			record(d.marks[start])
		} else if errors.Is(err, ebpf.ErrKeyNotExist) {
			record(d.marks[start])
		} else {
			d.entries[start].fail(err)
		}
		start++
	}
	d.reset()
}

func (d *deletes[K, V]) reset() {
	if cap(d.keys) > keptWrites {
		*d = deletes[K, V]{}
		return
	}
	clear(d.entries)
	clear(d.marks)
	d.keys, d.entries, d.marks = d.keys[:0], d.entries[:0], d.marks[:0]
}

// entry is one frontend of a round and the first error any of its writes
// met.
type entry struct {
	err error
}

func (e *entry) fail(err error) {
	if e != nil && e.err == nil {
		e.err = err
	}
}
