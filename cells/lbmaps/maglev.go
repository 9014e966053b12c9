package lbmaps

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive/cell"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/pkg/lbmap"
)

// MaglevMap holds the Maglev table of each frontend that uses Maglev: a
// HashOfMaps from RevNATIndex to a single-entry array whose value is the
// table, TableSize backend IDs. A program picks slot hash % TableSize.
type MaglevMap struct {
	tables *bpfmaps.MapOfMaps[lbmap.RevNATIndex]
	size   int
}

func newMaglevMap(lc cell.Lifecycle, reg *bpfmaps.Registry, name string, frontends, tableSize uint32) (*MaglevMap, error) {
	tables, err := bpfmaps.NewMapOfMaps[lbmap.RevNATIndex](lc, reg, bpfmaps.Spec{
		Name:       name,
		Type:       ebpf.HashOfMaps,
		MaxEntries: frontends,
		Flags:      unix.BPF_F_NO_PREALLOC,
		InnerMap: &bpfmaps.InnerSpec{
			Type:       ebpf.Array,
			KeySize:    4,
			ValueSize:  4 * tableSize,
			MaxEntries: 1,
		},
	})
	if err != nil {
		return nil, err
	}
	return &MaglevMap{tables: tables, size: int(tableSize)}, nil
}

// TableSize is the number of slots of every table, --lb-maglev-table-size.
func (m *MaglevMap) TableSize() int { return m.size }

func (m *MaglevMap) Name() string           { return m.tables.Name() }
func (m *MaglevMap) PinPath() string        { return m.tables.PinPath() }
func (m *MaglevMap) Origin() bpfmaps.Origin { return m.tables.Origin() }

// EBPF is the open outer map, for MapReplacements.
func (m *MaglevMap) EBPF() *ebpf.Map { return m.tables.EBPF() }

// Put sets the table of frontend revNAT. The new table replaces the old
// one at once: a program uses one or the other, never a mix.
func (m *MaglevMap) Put(revNAT lbmap.RevNATIndex, table []lbmap.BackendID) error {
	if len(table) != m.size {
		return fmt.Errorf("bpf map %s: table of %d slots for frontend %d, want %d (--lb-maglev-table-size)",
			m.Name(), len(table), revNAT, m.size)
	}
	inner, err := m.tables.NewInner()
	if err != nil {
		return err
	}
	defer inner.Close()
	if err := inner.Put(uint32(0), table); err != nil {
		return fmt.Errorf("bpf map %s: fill the table of frontend %d: %w", m.Name(), revNAT, err)
	}
	return m.tables.Put(revNAT, inner)
}

// Lookup returns the table of frontend revNAT. A missing table is an error
// that matches ebpf.ErrKeyNotExist.
func (m *MaglevMap) Lookup(revNAT lbmap.RevNATIndex) ([]lbmap.BackendID, error) {
	inner, err := m.tables.Lookup(revNAT)
	if err != nil {
		return nil, err
	}
	defer inner.Close()
	table := make([]lbmap.BackendID, m.size)
	if err := inner.Lookup(uint32(0), table); err != nil {
		return nil, fmt.Errorf("bpf map %s: read the table of frontend %d: %w", m.Name(), revNAT, err)
	}
	return table, nil
}

// Delete removes the table of frontend revNAT. A missing table is an error
// that matches ebpf.ErrKeyNotExist.
func (m *MaglevMap) Delete(revNAT lbmap.RevNATIndex) error { return m.tables.Delete(revNAT) }

// Iterate calls fn with each frontend that has a table until fn returns
// false.
func (m *MaglevMap) Iterate(fn func(lbmap.RevNATIndex) bool) error {
	return m.tables.Iterate(func(revNAT lbmap.RevNATIndex, _ ebpf.MapID) bool { return fn(revNAT) })
}
