package bpfmaps

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestCountEntries: a hash map's entries are counted in batches, every one
// once however many batches they take, and a map the kernel cannot batch
// (an LPM trie) is counted key by key; both agree with a walk.
func TestCountEntries(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create BPF maps")
	}
	for _, tc := range []struct {
		typ     ebpf.MapType
		entries int
	}{
		{ebpf.Hash, 0},
		{ebpf.Hash, 3},
		{ebpf.Hash, 2*iterateChunk + 17},
		{ebpf.LRUHash, iterateChunk + 1},
		{ebpf.LPMTrie, 100},
	} {
		spec := &ebpf.MapSpec{Type: tc.typ, KeySize: 8, ValueSize: 12, MaxEntries: uint32(3 * iterateChunk)}
		if tc.typ == ebpf.LPMTrie {
			spec.Flags = 1 // BPF_F_NO_PREALLOC, which a trie needs
		}
		m, err := ebpf.NewMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		key, value := make([]byte, 8), make([]byte, 12)
		for i := range tc.entries {
			// A trie's key: a prefix length of 32, then the address.
			binary.LittleEndian.PutUint32(key[:4], 32)
			binary.BigEndian.PutUint32(key[4:], uint32(i))
			if err := m.Put(key, value); err != nil {
				t.Fatal(err)
			}
		}
		if tc.typ != ebpf.LPMTrie {
			if n, err := countBatched(m); err != nil || n != tc.entries {
				t.Errorf("%s with %d entries: batched count %d, %v", tc.typ, tc.entries, n, err)
			}
		}
		if n, err := countEntries(m); err != nil || n != tc.entries {
			t.Errorf("%s with %d entries: count %d, %v", tc.typ, tc.entries, n, err)
		}
	}
}
