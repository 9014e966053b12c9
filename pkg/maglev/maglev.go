package maglev

import (
	"fmt"
	"slices"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// DefaultSize is the table size to use unless a service has more than about
// 160 backends: see the package documentation.
const DefaultSize = 16381

// sizes are prime, so that every skip in [1, m-1] is coprime with m and each
// backend's permutation visits every slot. Each is the largest prime below a
// power of two, from 2^8 to 2^17, so a table of 32-bit backend IDs stays
// just under a power-of-two number of bytes.
var sizes = []int{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}

// Sizes returns the table sizes that Table accepts, smallest first.
func Sizes() []int { return slices.Clone(sizes) }

// IsValidSize reports whether m is one of Sizes.
func IsValidSize(m int) bool { return slices.Contains(sizes, m) }

// The seeds of the two hashes that place a backend's permutation: its first
// slot (offset) and its stride (skip). They are part of the wire contract
// with every other node and with earlier releases: changing either
// reshuffles every table, moving established flows to other backends.
const (
	offsetSeed uint64 = 0x6d61676c65762d6f // "maglev-o"
	skipSeed   uint64 = 0x6d61676c65762d73 // "maglev-s"
)

// Table returns the Maglev lookup table of m slots for backends: slot i
// holds an index into backends. See the package documentation for the
// guarantees. With no backends the table is empty. With more backends than
// slots, the m backends whose identities sort first get one slot each.
//
// It fails if m is not one of Sizes or if two backends share an identity.
func Table(backends []string, m int) ([]int, error) {
	if !IsValidSize(m) {
		return nil, fmt.Errorf("invalid Maglev table size %d: want one of %v", m, sizes)
	}
	if len(backends) == 0 {
		return []int{}, nil
	}

	// Taking turns in identity order, not in the caller's order, is what
	// makes the table independent of the order of backends.
	order := make([]int, len(backends))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(backends[a], backends[b]) })
	for k := 1; k < len(order); k++ {
		if backends[order[k]] == backends[order[k-1]] {
			return nil, fmt.Errorf("duplicate Maglev backend %q: each backend needs a unique identity", backends[order[k]])
		}
	}

	// A backend's permutation is slot (offset + j·skip) mod m for j = 0, 1,
	// ...; next is the slot its permutation reaches next, so nothing of size
	// n·m is ever built.
	type permutation struct{ next, skip int }
	perms := make([]permutation, len(order))
	for k, i := range order {
		perms[k] = permutation{
			next: int(hash(backends[i], offsetSeed) % uint64(m)),
			skip: int(hash(backends[i], skipSeed)%uint64(m-1)) + 1,
		}
	}

	table := make([]int, m)
	for s := range table {
		table[s] = -1
	}
	// Backends take turns claiming the next free slot of their own
	// permutation until every slot is taken (the paper's Populate).
	filled := 0
	for {
		for k, i := range order {
			p := &perms[k]
			for table[p.next] >= 0 {
				p.next = advance(p.next, p.skip, m)
			}
			table[p.next] = i
			p.next = advance(p.next, p.skip, m)
			filled++
			if filled == m {
				return table, nil
			}
		}
	}
}

// advance is (slot + skip) mod m for slot, skip < m, without a division.
func advance(slot, skip, m int) int {
	slot += skip
	if slot >= m {
		slot -= m
	}
	return slot
}

// hash is XXH64 of identity with seed: its output is fixed by the
// algorithm's specification, unlike hash/maphash, whose seeds live only as
// long as the process.
func hash(identity string, seed uint64) uint64 {
	var d xxhash.Digest
	d.ResetWithSeed(seed)
	d.WriteString(identity)
	return d.Sum64()
}
