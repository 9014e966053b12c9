package lbmaps

import (
	"errors"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/cells/bpfmaps"
)

// puts collects the writes of a reconciliation round to one map, so that
// they go to the kernel in one system call. Each write belongs to a batch
// entry (a frontend) and has a function that records it in the realized
// state once the kernel has it; a write that fails is retried alone, so its
// error lands on its own frontend and the others go on.
type puts[K, V any] struct {
	keys    []K
	values  []V
	entries []*entry
	written []func()
}

func (p *puts[K, V]) add(e *entry, k K, v V, written func()) {
	p.keys = append(p.keys, k)
	p.values = append(p.values, v)
	p.entries = append(p.entries, e)
	p.written = append(p.written, written)
}

func (p *puts[K, V]) flush(m *bpfmaps.Map[K, V], c *counters) {
	for start := 0; start < len(p.keys); {
		n, err := m.BatchPut(p.keys[start:], p.values[start:])
		for i := start; i < start+n; i++ {
			p.done(i)
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
			p.done(start)
		}
		start++
	}
	*p = puts[K, V]{}
}

func (p *puts[K, V]) done(i int) {
	if p.written[i] != nil {
		p.written[i]()
	}
}

// deletes is puts for deletions. Deleting a key that is already gone
// succeeds: the kernel state is what was wanted.
type deletes[K, V any] struct {
	keys    []K
	entries []*entry
	deleted []func()
}

func (d *deletes[K, V]) add(e *entry, k K, deleted func()) {
	d.keys = append(d.keys, k)
	d.entries = append(d.entries, e)
	d.deleted = append(d.deleted, deleted)
}

func (d *deletes[K, V]) flush(m *bpfmaps.Map[K, V], c *counters) {
	for start := 0; start < len(d.keys); {
		n, err := m.BatchDelete(d.keys[start:])
		for i := start; i < start+n; i++ {
			d.done(i)
		}
		c.deleted(m.Name(), n)
		start += n
		if err == nil {
			break
		}
		if err := m.Delete(d.keys[start]); err == nil {
			c.deleted(m.Name(), 1)
			d.done(start)
		} else if errors.Is(err, ebpf.ErrKeyNotExist) {
			d.done(start)
		} else {
			d.entries[start].fail(err)
		}
		start++
	}
	*d = deletes[K, V]{}
}

func (d *deletes[K, V]) done(i int) {
	if d.deleted[i] != nil {
		d.deleted[i]()
	}
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
