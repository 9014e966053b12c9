package lbmaps

import (
	"testing"

	"github.com/cellium/cellium/pkg/lbmap"
)

// TestRoundBuffersBounded: a round keeps its buffers for the next one, up
// to keptWrites writes; the buffers of a larger round (a prune after a
// restart) are let go, not held for the agent's lifetime.
func TestRoundBuffersBounded(t *testing.T) {
	fill := func(n int) *puts[lbmap.BackendID, lbmap.Backend4] {
		p := &puts[lbmap.BackendID, lbmap.Backend4]{}
		for i := range n {
			p.add(&entry{}, lbmap.BackendID(i), lbmap.Backend4{}, mark{bs: &backendState{}})
		}
		return p
	}
	small := fill(100)
	small.reset()
	if len(small.keys) != 0 || cap(small.keys) < 100 || cap(small.marks) < 100 {
		t.Errorf("after a round of 100 writes: len %d, cap %d/%d; want empty with the room kept", len(small.keys), cap(small.keys), cap(small.marks))
	}
	for _, m := range small.marks[:cap(small.marks)] {
		if m.bs != nil {
			t.Fatal("a kept buffer still points at a backend of the last round")
		}
	}
	large := fill(keptWrites + 1)
	large.reset()
	if cap(large.keys) != 0 || cap(large.values) != 0 || cap(large.entries) != 0 || cap(large.marks) != 0 {
		t.Errorf("after a round of %d writes the buffers are kept (cap %d)", keptWrites+1, cap(large.keys))
	}

	d := &deletes[lbmap.BackendID, lbmap.Backend4]{}
	for i := range keptWrites + 1 {
		d.add(nil, lbmap.BackendID(i), mark{})
	}
	d.reset()
	if cap(d.keys) != 0 || cap(d.marks) != 0 {
		t.Errorf("after a round of %d deletes the buffers are kept (cap %d)", keptWrites+1, cap(d.keys))
	}
}
