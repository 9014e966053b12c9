package lbmaps

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/cells/internal/addrmap"
	"github.com/cellium/cellium/pkg/lbmap"
)

// TestOrphanIDHandedOver: a leftover's ID that a frontend of the other
// family holds at restore stays used when that frontend goes before the
// prune, and every leftover's ID is free again once the prune deleted it.
func TestOrphanIDHandedOver(t *testing.T) {
	r := newRealized(16, 16)
	six := addrmap.KeyOf(netip.MustParseAddr("fd00::10"), 80, uint8(lbmap.TCP))
	for _, id := range []uint32{1, 3} {
		if err := r.frontendIDs.reserve(id); err != nil {
			t.Fatal(err)
		}
	}
	fs := &frontendState{id: 1}
	r.frontends.Set(six, fs)
	// IPv4 leftovers at 1 (the IPv6 frontend's ID) and at 2 (a gap).
	nop := func() error { return nil }
	r.orphans = []orphan{{id: 1, remove: nop}, {id: 2, remove: nop}, {id: 2, remove: nop}}
	r.holdOrphanIDs()

	r.forgetFrontend(six, fs)
	got, err := r.frontendIDs.allocate()
	if err != nil {
		t.Fatal(err)
	}
	if got != 4 {
		t.Fatalf("allocated ID %d before the prune, want 4: 1 and 2 have leftover entries", got)
	}

	r.orphans = nil // the prune deleted them
	r.releaseOrphanIDs()
	var ids []uint32
	for range 2 {
		id, err := r.frontendIDs.allocate()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if !(ids[0] == 1 && ids[1] == 2 || ids[0] == 2 && ids[1] == 1) {
		t.Fatalf("allocated %v after the prune, want 1 and 2 again", ids)
	}
}
