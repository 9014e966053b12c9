package lbmaps_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/internal/drift/drifttest"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/lbmap"
)

// The stray tests write, into the pinned maps of an agent that is down,
// backend entries that restore does not adopt (strays): an address at
// two IDs, an unknown protocol, an ID that is a backend's in the other
// family. Each test checks, on the next start, that
//   - while a live frontend's slot or Maglev table points at a stray, its
//     entry stays (the frontend's traffic still reaches it) and no new
//     backend gets its ID: that would send the frontend's traffic to
//     another service's backend;
//   - once the frontends are reconciled and pruned, the strays are gone
//     from the maps, each counted as a repair, and the frontends' entries
//     are what they should be;
//   - their IDs are free again: every ID of the backend map can be used.
//
// The backend map holds 8 entries, so that a test can use up every ID.
const strayMapMax = 8

func strayConfig(maglev bool) func(*lbmaps.Config) {
	return func(c *lbmaps.Config) {
		c.LBBackendMapMax = strayMapMax
		if maglev {
			c.LBAlgorithm = lbmaps.AlgorithmMaglev
		}
	}
}

// TestStrayDuplicateAddress: one backend address at two IDs. The lower ID
// is kept; a slot and a Maglev table point at the higher one. Once the
// slot is rewritten, the table still holds the stray.
func TestStrayDuplicateAddress(t *testing.T) {
	const be = "10.244.0.1:8080/TCP"
	f := frontend("10.96.0.10:80/TCP", be)
	g := frontend("10.96.0.11:80/TCP", be)
	h := frontend("10.96.0.12:80/TCP", be)
	root, first := firstRun(t, strayConfig(true), f, g, h)
	kept := first.service4("10.96.0.10:80/TCP")[1].BackendID
	dup := kept + 5
	// The same address at dup; g's slot points at it, and h's Maglev
	// table (h's slot still points at kept).
	if err := first.maps.Backends4.Put(dup, lbmap.NewBackend4(netip.MustParseAddr("10.244.0.1"), 8080, lbmap.TCP)); err != nil {
		t.Fatal(err)
	}
	first.putSlot4(t, "10.96.0.11:80/TCP", 1, dup)
	table := make([]lbmap.BackendID, first.maps.Maglev4.TableSize())
	for i := range table {
		table[i] = dup
	}
	if err := first.maps.Maglev4.Put(first.service4("10.96.0.12:80/TCP")[0].RevNATIndex, table); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := newLBEnv(t, root, strayConfig(true))
	// g is reconciled before the sync, its slot rewritten; h is not yet:
	// its Maglev table (it has the Maglev flag) still sends its traffic
	// to dup.
	second.set(false, g)
	second.waitDoneOrError(t)
	if got := second.slotIDs4(t, "10.96.0.11:80/TCP"); !slices.Equal(got, []lbmap.BackendID{kept}) {
		t.Errorf("g's slots at %v after its update, want [%d]", got, kept)
	}
	if b, err := second.maps.Backends4.Lookup(dup); err != nil || b.AddrPort().String() != "10.244.0.1:8080" {
		t.Errorf("backend %d = %v %v while h's Maglev table points at it, want 10.244.0.1:8080", dup, b, err)
	}
	// A frontend created while the agent was down takes every free ID.
	n := frontendWithNew("10.96.0.20:80/TCP", "10.244.1.%d:80/TCP", strayMapMax-2)
	second.set(false, g, n)
	second.waitDoneOrError(t)
	if ids := second.slotIDs4(t, "10.96.0.20:80/TCP"); slices.Contains(ids, dup) {
		t.Errorf("new backends got IDs %v while h's Maglev table pointed at %d", ids, dup)
	}

	second.set(true, f, g, h, n)
	second.waitDoneOrError(t)
	second.waitPruneOK(t)
	second.checkNoStrays(t, []lbmap.BackendID{dup}, nil, 1)
	for _, fe := range []string{"10.96.0.10:80/TCP", "10.96.0.11:80/TCP", "10.96.0.12:80/TCP"} {
		second.checkFrontend4(t, fe, "10.244.0.1:8080")
		id := second.service4(fe)[0].RevNATIndex
		if table, err := second.maps.Maglev4.Lookup(id); err != nil || !slices.Equal(distinct(table), []lbmap.BackendID{kept}) {
			t.Errorf("%s: Maglev table %v %v, want all at %d", fe, distinct(table), err, kept)
		}
	}
	second.checkEveryIDUsable(t)
}

// TestStrayUnknownProtocol: backend entries of an unknown protocol, one
// that a live frontend's slot points at and one that nothing does.
func TestStrayUnknownProtocol(t *testing.T) {
	f := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP", "10.244.0.2:8080/TCP")
	root, first := firstRun(t, strayConfig(false), f)
	const referenced, unreferenced = 5, 6
	for _, id := range []lbmap.BackendID{referenced, unreferenced} {
		if err := first.maps.Backends4.Put(id, lbmap.NewBackend4(netip.MustParseAddr("10.244.0.9"), 8080, lbmap.Proto(99))); err != nil {
			t.Fatal(err)
		}
	}
	first.putSlot4(t, "10.96.0.10:80/TCP", 2, referenced)
	first.stop()

	second := newLBEnv(t, root, strayConfig(false))
	n := frontendWithNew("10.96.0.20:80/TCP", "10.244.1.%d:80/TCP", strayMapMax-4)
	second.set(false, n)
	second.waitDoneOrError(t)
	if ids := second.slotIDs4(t, "10.96.0.20:80/TCP"); slices.Contains(ids, referenced) || slices.Contains(ids, unreferenced) {
		t.Errorf("new backends got IDs %v, among them a stray's (%d, %d) before it was cleaned", ids, referenced, unreferenced)
	}
	if got := second.backend4(referenced); got != "10.244.0.9:8080" {
		t.Errorf("backend %d = %s while f's slot 2 points at it, want 10.244.0.9:8080", referenced, got)
	}

	second.set(true, f, n)
	second.waitDoneOrError(t)
	second.waitPruneOK(t)
	second.checkNoStrays(t, []lbmap.BackendID{referenced, unreferenced}, nil, 2)
	second.checkFrontend4(t, "10.96.0.10:80/TCP", "10.244.0.1:8080", "10.244.0.2:8080")
	second.checkEveryIDUsable(t)
}

// TestStrayOtherFamily: an IPv6 backend entry at the ID of an IPv4
// backend (IDs are one space for both), which an IPv6 frontend's slot
// points at. When the IPv4 backend goes, its ID stays used until the IPv6
// entry is gone.
func TestStrayOtherFamily(t *testing.T) {
	f4 := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	s6 := frontend("[fd00::10]:80/TCP", "[fd00:244::1]:8080/TCP")
	root, first := firstRun(t, strayConfig(false), f4, s6)
	shared := first.service4("10.96.0.10:80/TCP")[1].BackendID
	if err := first.maps.Backends6.Put(shared, lbmap.NewBackend6(netip.MustParseAddr("fd00:244::9"), 8080, lbmap.TCP)); err != nil {
		t.Fatal(err)
	}
	s6Slot := lbmap.NewService6Key(netip.MustParseAddr("fd00::10"), 80, lbmap.TCP, 1)
	own, err := first.maps.Services6.Lookup(s6Slot)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.maps.Services6.Put(s6Slot, lbmap.NewServiceSlot(shared, own.RevNATIndex)); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := newLBEnv(t, root, strayConfig(false))
	// f4 is reconciled and then deleted before the sync: its backend
	// entry goes, the ID stays the IPv6 stray's.
	second.set(false, f4)
	second.waitDoneOrError(t)
	second.set(false)
	second.waitDoneOrError(t)
	if b, err := second.maps.Backends4.Lookup(shared); err == nil {
		t.Errorf("IPv4 backend %d = %s after its only frontend went, want it deleted", shared, b)
	}
	n6 := frontendWithNew("[fd00::20]:80/TCP", "[fd00:244::1:%d]:80/TCP", 3)
	second.set(false, n6)
	second.waitDoneOrError(t)
	ids := second.slotIDs6(t, "[fd00::20]:80/TCP")
	if slices.Contains(ids, shared) {
		t.Errorf("new IPv6 backends got IDs %v while s6's slot pointed at the IPv6 entry at %d", ids, shared)
	}
	if b, err := second.maps.Backends6.Lookup(shared); err != nil || b.AddrPort().String() != "[fd00:244::9]:8080" {
		t.Errorf("IPv6 backend %d = %v %v while s6's slot points at it, want [fd00:244::9]:8080", shared, b, err)
	}

	second.set(true, s6, n6)
	second.waitDoneOrError(t)
	second.waitPruneOK(t)
	second.checkNoStrays(t, nil, []lbmap.BackendID{shared}, 1)
	if v, err := second.maps.Services6.Lookup(s6Slot); err != nil || v.BackendID != own.BackendID || v.RevNATIndex != own.RevNATIndex {
		t.Errorf("s6's slot = %v %v, want %v", v, err, own)
	}
	if b, err := second.maps.Backends6.Lookup(own.BackendID); err != nil || b.AddrPort().String() != "[fd00:244::1]:8080" {
		t.Errorf("s6's backend %d = %v %v, want [fd00:244::1]:8080", own.BackendID, b, err)
	}
	second.checkEveryIDUsable(t)
}

// frontendWithNew is a frontend at fe with n backends, format (of one
// number, 1..n) giving their addresses.
func frontendWithNew(fe, format string, n int) *loadbalancer.Frontend {
	backends := make([]string, n)
	for i := range backends {
		backends[i] = fmt.Sprintf(format, i+1)
	}
	return frontend(fe, backends...)
}

// putSlot4 points slot n of the IPv4 frontend fe at backend id.
func (e *lbEnv) putSlot4(t *testing.T, fe string, n uint16, id lbmap.BackendID) {
	t.Helper()
	a := addr(fe)
	master := e.service4(fe)[0]
	if err := e.maps.Services4.Put(lbmap.NewService4Key(a.Addr, a.Port, lbmap.TCP, n), lbmap.NewServiceSlot(id, master.RevNATIndex)); err != nil {
		t.Fatal(err)
	}
}

// slotIDs4 are the backend IDs of the IPv4 frontend fe's slots.
func (e *lbEnv) slotIDs4(t *testing.T, fe string) []lbmap.BackendID {
	t.Helper()
	var ids []lbmap.BackendID
	for n, v := range e.service4(fe) {
		if n > 0 {
			ids = append(ids, v.BackendID)
		}
	}
	return ids
}

// slotIDs6 are the backend IDs of the IPv6 frontend fe's slots.
func (e *lbEnv) slotIDs6(t *testing.T, fe string) []lbmap.BackendID {
	t.Helper()
	a := addr(fe)
	var ids []lbmap.BackendID
	err := e.maps.Services6.Iterate(func(k lbmap.Service6Key, v lbmap.ServiceValue) bool {
		if k.AddrPort() == netip.AddrPortFrom(a.Addr, a.Port) && k.BackendSlot > 0 {
			ids = append(ids, v.BackendID)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// checkFrontend4 checks that the IPv4 frontend fe's entries send its
// traffic to backends, in slot order, and reverse NAT it.
func (e *lbEnv) checkFrontend4(t *testing.T, fe string, backends ...string) {
	t.Helper()
	svc := e.service4(fe)
	master := svc[0]
	if int(master.Count) != len(backends) || len(svc) != len(backends)+1 {
		t.Errorf("%s: %v, want a master counting %d slots", fe, svc, len(backends))
		return
	}
	for i, be := range backends {
		slot := svc[uint16(i+1)]
		if got := e.backend4(slot.BackendID); got != be || slot.RevNATIndex != master.RevNATIndex {
			t.Errorf("%s: slot %d = %v at %s, want %s under reverse NAT %d", fe, i+1, slot, got, be, master.RevNATIndex)
		}
	}
	a := addr(fe)
	if rev, err := e.maps.RevNAT4.Lookup(master.RevNATIndex); err != nil || rev.AddrPort() != netip.AddrPortFrom(a.Addr, a.Port) {
		t.Errorf("%s: reverse NAT %d = %v %v", fe, master.RevNATIndex, rev, err)
	}
}

// checkNoStrays checks that the backend maps hold no entry at the strays'
// IDs (gone4 in the IPv4 map, gone6 in the IPv6 one), that every entry
// left is a distinct address some slot points at, and that the repairs
// counted are want.
func (e *lbEnv) checkNoStrays(t *testing.T, gone4, gone6 []lbmap.BackendID, want float64) {
	t.Helper()
	for _, id := range gone4 {
		if b, err := e.maps.Backends4.Lookup(id); err == nil {
			t.Errorf("stray IPv4 backend %d = %s still in the map after the prune", id, b)
		}
	}
	for _, id := range gone6 {
		if b, err := e.maps.Backends6.Lookup(id); err == nil {
			t.Errorf("stray IPv6 backend %d = %s still in the map after the prune", id, b)
		}
	}
	// Every backend entry left is a distinct address that a slot of its
	// family points at.
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	pointed4, pointed6 := map[lbmap.BackendID]bool{}, map[lbmap.BackendID]bool{}
	must(e.maps.Services4.Iterate(func(k lbmap.Service4Key, v lbmap.ServiceValue) bool {
		pointed4[v.BackendID] = k.BackendSlot > 0 || pointed4[v.BackendID]
		return true
	}))
	must(e.maps.Services6.Iterate(func(k lbmap.Service6Key, v lbmap.ServiceValue) bool {
		pointed6[v.BackendID] = k.BackendSlot > 0 || pointed6[v.BackendID]
		return true
	}))
	seen := map[string]lbmap.BackendID{}
	check := func(pointed map[lbmap.BackendID]bool, id lbmap.BackendID, b fmt.Stringer) {
		if !pointed[id] {
			t.Errorf("backend %d = %s left in the map, no slot points at it", id, b)
		}
		if other, dup := seen[b.String()]; dup {
			t.Errorf("backend %s at IDs %d and %d", b, other, id)
		}
		seen[b.String()] = id
	}
	must(e.maps.Backends4.Iterate(func(id lbmap.BackendID, b lbmap.Backend4) bool { check(pointed4, id, b); return true }))
	must(e.maps.Backends6.Iterate(func(id lbmap.BackendID, b lbmap.Backend6) bool { check(pointed6, id, b); return true }))
	if got := drifttest.Repairs(t, e.registry, "lb-maps", "lb-backend"); got != want {
		t.Errorf("cellium_kernel_repairs_total{module=lb-maps,object=lb-backend} = %v, want %v", got, want)
	}
}

// checkEveryIDUsable creates a frontend with as many new backends as the
// backend map has room for beside the ones in use: it is reconciled only
// if no ID leaked (held with no entry).
func (e *lbEnv) checkEveryIDUsable(t *testing.T) {
	t.Helper()
	used := map[lbmap.BackendID]bool{}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.maps.Backends4.Iterate(func(id lbmap.BackendID, _ lbmap.Backend4) bool { used[id] = true; return true }))
	must(e.maps.Backends6.Iterate(func(id lbmap.BackendID, _ lbmap.Backend6) bool { used[id] = true; return true }))
	var all []*loadbalancer.Frontend
	for fe := range e.frontends.All(e.db.ReadTxn()) {
		all = append(all, fe)
	}
	all = append(all, frontendWithNew("10.96.0.30:80/TCP", "10.244.2.%d:80/TCP", strayMapMax-len(used)))
	e.set(true, all...)
	e.waitDoneOrError(t)
}

// waitDoneOrError is waitDone, failing at once when a frontend's
// reconciliation failed (an ID or a map entry the agent could not get).
func (e *lbEnv) waitDoneOrError(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rev := e.frontends.Revision(e.db.ReadTxn())
	if _, _, err := e.rec.WaitUntilReconciled(ctx, rev); err != nil {
		t.Fatalf("frontends not reconciled up to revision %d in 30s: %v", rev, err)
	}
	for fe := range e.frontends.All(e.db.ReadTxn()) {
		if fe.Status.Kind() == reconciler.StatusKindError {
			t.Fatalf("frontend %s: %s", fe.Address, fe.GetStatus())
		}
	}
	e.waitDone()
}

// TestRestoreDropsBadMasters: a master entry whose frontend ID is out of
// range, and one whose ID is another frontend's, are not adopted; both
// frontends are stale, and the first prune deletes their masters with
// their slots (the datapath would go on matching a master left alone,
// refusing the connections to its address), leaving the live frontend's
// entries as wanted, and no reverse NAT entry but its own. So does a
// stale frontend whose reverse NAT entry holds another address.
func TestRestoreDropsBadMasters(t *testing.T) {
	a := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	outOfRange := frontend("10.96.0.11:80/TCP", "10.244.0.2:8080/TCP")
	twice := frontend("10.96.0.12:80/TCP", "10.244.0.3:8080/TCP")
	root, first := firstRun(t, nil, a, outOfRange, twice)
	aID := first.service4("10.96.0.10:80/TCP")[0].RevNATIndex
	for fe, id := range map[string]lbmap.RevNATIndex{"10.96.0.11:80/TCP": 100, "10.96.0.12:80/TCP": aID} {
		fa := addr(fe)
		if err := first.maps.Services4.Put(lbmap.NewService4Key(fa.Addr, fa.Port, lbmap.TCP, 0), lbmap.NewServiceMaster(1, id, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	first.stop()

	// A stale frontend whose reverse NAT entry holds another address.
	other := frontend("10.96.0.13:80/TCP", "10.244.0.4:8080/TCP")
	root2, first2 := firstRun(t, nil, a, other)
	otherID := first2.service4("10.96.0.13:80/TCP")[0].RevNATIndex
	if err := first2.maps.RevNAT4.Put(otherID, lbmap.NewRevNAT4(netip.MustParseAddr("10.96.0.99"), 80)); err != nil {
		t.Fatal(err)
	}
	first2.stop()

	for _, run := range []struct {
		root  string
		stale []string
	}{{root, []string{"10.96.0.11:80/TCP", "10.96.0.12:80/TCP"}}, {root2, []string{"10.96.0.13:80/TCP"}}} {
		second := newLBEnv(t, run.root, nil)
		second.set(true, a)
		second.waitDoneOrError(t)
		second.waitPruneOK(t)
		for _, fe := range run.stale {
			if svc := second.service4(fe); len(svc) != 0 {
				t.Errorf("stale frontend %s after the prune: %v, want no entry", fe, svc)
			}
		}
		second.checkFrontend4(t, "10.96.0.10:80/TCP", "10.244.0.1:8080")
		if rev := second.dumpPrefix("rev4"); len(rev) != 1 {
			t.Errorf("reverse NAT entries after the prune: %v, want only 10.96.0.10:80's", rev)
		}
		second.stop()
	}
}

// TestUntrustedSlotHoldsItsBackend: a slot whose reverse NAT index is not
// its master's is not trusted, and rewritten; until then the programs
// still send its frontend's traffic to the backend it points at, so that
// backend's entry stays and its ID is not handed out when the frontend
// that pointed at it by right moves to another backend.
func TestUntrustedSlotHoldsItsBackend(t *testing.T) {
	f := frontend("10.96.0.10:80/TCP", "10.244.0.1:8080/TCP")
	g := frontend("10.96.0.11:80/TCP", "10.244.0.2:8080/TCP")
	root, first := firstRun(t, strayConfig(false), f, g)
	gSlot := first.service4("10.96.0.11:80/TCP")[1]
	fa := addr("10.96.0.10:80/TCP")
	if err := first.maps.Services4.Put(lbmap.NewService4Key(fa.Addr, fa.Port, lbmap.TCP, 1), gSlot); err != nil {
		t.Fatal(err)
	}
	first.stop()

	second := newLBEnv(t, root, strayConfig(false))
	g2 := frontend("10.96.0.11:80/TCP", "10.244.0.3:8080/TCP")
	second.set(false, g2)
	second.waitDoneOrError(t)
	if got := second.backend4(gSlot.BackendID); got != "10.244.0.2:8080" {
		t.Errorf("backend %d = %s after g moved off it, while f's slot points at it: want 10.244.0.2:8080", gSlot.BackendID, got)
	}
	n := frontendWithNew("10.96.0.20:80/TCP", "10.244.1.%d:80/TCP", strayMapMax-3)
	second.set(false, g2, n)
	second.waitDoneOrError(t)
	if ids := second.slotIDs4(t, "10.96.0.20:80/TCP"); slices.Contains(ids, gSlot.BackendID) {
		t.Errorf("new backends got IDs %v while f's slot pointed at %d", ids, gSlot.BackendID)
	}

	second.set(true, f, g2, n)
	second.waitDoneOrError(t)
	second.waitPruneOK(t)
	second.checkNoStrays(t, []lbmap.BackendID{gSlot.BackendID}, nil, 0)
	second.checkFrontend4(t, "10.96.0.10:80/TCP", "10.244.0.1:8080")
	second.checkFrontend4(t, "10.96.0.11:80/TCP", "10.244.0.3:8080")
	second.checkEveryIDUsable(t)
}

// firstRun is an agent on a new bpffs that has written fes and restored
// and pruned, so that nothing it does races with the changes a test then
// makes to its maps behind its back before stopping it.
func firstRun(t *testing.T, cfg func(*lbmaps.Config), fes ...*loadbalancer.Frontend) (root string, e *lbEnv) {
	t.Helper()
	root = bpfmapstest.Root(t)
	e = newLBEnv(t, root, cfg)
	e.set(true, fes...)
	e.waitDone()
	e.waitPruneOK(t)
	return root, e
}
