package lbmaps

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/cellium/cellium/cells/internal/addrmap"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/lbmap"
)

// realized is what the kernel's maps hold, as far as the reconciler knows:
// read from the pinned maps at start, then kept up to date by every write
// that succeeds. Comparing a frontend with it is how a restart, or a
// frontend that did not change, writes nothing. It is read and written
// under ops.mu, after restore has filled it (ops.waitRestored): by the
// reconciler's operations and by Holds, which the loadbalancer writer
// calls.
type realized struct {
	frontends addrmap.Map[*frontendState]
	backends  addrmap.Map[*backendState]
	// backendByID is indexed by backend ID, which are dense.
	backendByID []*backendState
	frontendIDs *idAllocator
	backendIDs  *idAllocator
	// orphans delete entries found at restore that belong to no frontend
	// of their family (a reverse NAT or Maglev entry without its service
	// entry). They are run by the first prune, after Kubernetes state has
	// synced; one that fails is kept for the next.
	orphans []orphan
	// orphanIDs are the IDs the orphans' entries are at. Each stays used
	// in frontendIDs until its entries are deleted, so no new frontend
	// gets it and then has its entries deleted by the prune. true: the
	// orphans hold it; false: a frontend of the other family does, and
	// hands it over when forgotten (forgetFrontend).
	orphanIDs map[lbmap.RevNATIndex]bool
	// strays are the backend entries restore found and did not adopt (see
	// stray), by family and ID. Their IDs stay used in backendIDs until
	// their entries are deleted.
	strays map[strayKey]*stray
	// maglevStrays are the strays each restored frontend's Maglev table
	// points at: it holds a reference on them until the table is
	// replaced or deleted.
	maglevStrays map[*frontendState][]*backendState
	// untrusted are the slots restore found pointing at a backend of
	// their family but did not trust (their reverse NAT index not their
	// master's, or no master): recorded as unknownBackend, so that they
	// are rewritten or deleted, each holds a reference on the backend
	// until then, as the programs still send its frontend's traffic
	// there: the backend's entry stays and its ID is not handed out.
	untrusted map[slotKey]*backendState
}

// slotKey is slot n of a frontend.
type slotKey struct {
	fs *frontendState
	n  int
}

// releaseUntrusted drops the reference slot n of fs held as an untrusted
// slot, now that it is rewritten or deleted, and returns the backend it
// held, or nil.
func (r *realized) releaseUntrusted(fs *frontendState, n int) *backendState {
	if len(r.untrusted) == 0 {
		return nil
	}
	k := slotKey{fs, n}
	bs := r.untrusted[k]
	if bs != nil {
		bs.refs--
		delete(r.untrusted, k)
	}
	return bs
}

// orphan is one leftover entry at a frontend ID, and how to delete it.
type orphan struct {
	id     lbmap.RevNATIndex
	remove func() error
	// object, what, where and why say what the prune removed (repairs).
	object, what, where, why string
}

// stray is a backend entry restore found and did not adopt: its address
// is at a lower ID too, its protocol is unknown, its address is of the
// other family, its ID is out of range or a backend of the other family
// has it. No wanted backend ever has its ID, so a slot or a Maglev table
// pointing at it is rewritten or deleted; until then its entry stays
// (the slots still send their traffic there) and its ID stays used, so
// that no new backend takes it over while the old slots point at it. Its
// entry is deleted, and the ID freed, once nothing points at it: in the
// round that rewrites the last slot or table, or at a prune.
type stray struct {
	bs *backendState
	// what is the entry (its ID and address) and why it was not adopted,
	// for the log.
	what, why string
}

// strayKey is a stray's family and ID: one ID may be a backend's in one
// family and a stray's in the other.
type strayKey struct {
	id  lbmap.BackendID
	is4 bool
}

// holdOrphanIDs reserves the orphans' IDs no frontend holds. It runs after
// both families are restored: a frontend of either may hold an orphan's ID.
func (r *realized) holdOrphanIDs() {
	r.orphanIDs = make(map[lbmap.RevNATIndex]bool, len(r.orphans))
	for _, o := range r.orphans {
		if _, ok := r.orphanIDs[o.id]; !ok {
			// reserve fails where a frontend holds the ID (or it is out
			// of range, which no frontend is given).
			r.orphanIDs[o.id] = r.frontendIDs.reserve(uint32(o.id)) == nil
		}
	}
}

// releaseOrphanIDs frees the IDs of the orphans whose entries are gone
// (none is left in r.orphans at that ID) and that no frontend holds.
func (r *realized) releaseOrphanIDs() {
	left := map[lbmap.RevNATIndex]bool{}
	for _, o := range r.orphans {
		left[o.id] = true
	}
	for id, held := range r.orphanIDs {
		if left[id] {
			continue
		}
		if held {
			r.frontendIDs.release(uint32(id))
		}
		delete(r.orphanIDs, id)
	}
}

// frontendState is what is written for one frontend. The fields are in the
// order that packs them in 48 bytes (one is kept per frontend).
type frontendState struct {
	id lbmap.RevNATIndex
	// hasMaster is false when there is no master entry (not written yet,
	// or only slots survived in the maps).
	hasMaster bool
	// revNAT says the reverse NAT entry holds this frontend's address.
	revNAT bool
	// master is the slot 0 entry as written.
	master lbmap.ServiceValue
	// maglev is the hash of the Maglev table written, 0 for none.
	maglev uint64
	// slots[i] is the backend written at slot i+1; 0 where none is.
	slots []lbmap.BackendID
}

// unknownBackend marks a slot that holds an entry whose content is not
// trusted (found at restore pointing nowhere, or under another frontend ID):
// it equals no real backend ID, so the slot is rewritten or deleted.
const unknownBackend = lbmap.BackendID(1<<32 - 1)

// backendState is one backend entry.
type backendState struct {
	addr    addrKey
	id      lbmap.BackendID
	written bool
	// stray says the entry is one restore did not adopt (see stray): it is
	// not in backends or backendByID, but in strays.
	stray bool
	// refs counts the written slots that point at the backend: at 0 its
	// entry can go. 32 bits keep the state in 32 bytes.
	refs int32
}

func newRealized(maxFrontends, maxBackends uint32) *realized {
	return &realized{
		frontends:   addrmap.New[*frontendState](),
		backends:    addrmap.New[*backendState](),
		frontendIDs: newIDAllocator("frontend", maxFrontends),
		backendIDs:  newIDAllocator("backend", maxBackends),
	}
}

// frontend returns the state of addr, creating it, and giving it an ID, if
// needed.
func (r *realized) frontend(addr addrKey) (*frontendState, error) {
	fs, ok := r.frontends.Get(addr)
	if !ok {
		fs = &frontendState{}
		r.frontends.Set(addr, fs)
	}
	if fs.id == 0 {
		id, err := r.frontendIDs.allocate()
		if err != nil {
			return nil, err
		}
		fs.id = lbmap.RevNATIndex(id)
	}
	return fs, nil
}

// backend returns the state of addr, creating it with a new ID if needed.
func (r *realized) backend(addr addrKey) (*backendState, error) {
	if bs, ok := r.backends.Get(addr); ok {
		return bs, nil
	}
	id, err := r.backendIDs.allocate()
	if err != nil {
		return nil, err
	}
	bs := &backendState{addr: addr, id: lbmap.BackendID(id)}
	r.backends.Set(addr, bs)
	r.setByID(bs)
	return bs, nil
}

// forgetFrontend drops a frontend whose entries are all gone.
func (r *realized) forgetFrontend(addr addrKey, fs *frontendState) {
	r.frontends.Delete(addr)
	if fs.id == 0 {
		return
	}
	if held, ok := r.orphanIDs[fs.id]; ok && !held {
		// Leftover entries of the other family are at this ID: it stays
		// used until they are deleted.
		r.orphanIDs[fs.id] = true
		return
	}
	r.frontendIDs.release(uint32(fs.id))
}

// forgetBackend drops a backend, or a stray, whose entry is gone.
func (r *realized) forgetBackend(bs *backendState) {
	if bs.stray {
		delete(r.strays, strayKey{bs.id, bs.addr.Is4})
	} else {
		r.backends.Delete(bs.addr)
		r.backendByID[bs.id] = nil
	}
	r.releaseBackendID(bs.id)
}

// adoptedAt is the backend of either family with id, or nil.
func (r *realized) adoptedAt(id lbmap.BackendID) *backendState {
	if int(id) < len(r.backendByID) {
		return r.backendByID[id]
	}
	return nil
}

// releaseBackendID frees id once neither a backend nor a stray of either
// family has it.
func (r *realized) releaseBackendID(id lbmap.BackendID) {
	if r.adoptedAt(id) != nil || r.strays[strayKey{id, true}] != nil || r.strays[strayKey{id, false}] != nil {
		return
	}
	r.backendIDs.release(uint32(id))
}

// addStray records a backend entry of the family is4 that restore does
// not adopt, keeping its ID used (if it is in range and free).
func (r *realized) addStray(is4 bool, id lbmap.BackendID, addr addrKey, what, why string) {
	addr.Is4 = is4 // the family of its map, whatever its address
	bs := &backendState{addr: addr, id: id, written: true, stray: true}
	if r.strays == nil {
		r.strays = map[strayKey]*stray{}
	}
	r.strays[strayKey{id, is4}] = &stray{bs: bs, what: what, why: why}
	_ = r.backendIDs.reserve(uint32(id)) // fails where it is out of range or used already
}

// holdMaglevStrays has fs's restored Maglev table hold a reference on each
// stray of the family is4 it points at.
func (r *realized) holdMaglevStrays(is4 bool, fs *frontendState, table []lbmap.BackendID) {
	var held []*backendState
	for _, id := range table {
		if s := r.strays[strayKey{id, is4}]; s != nil && !slices.Contains(held, s.bs) {
			s.bs.refs++
			held = append(held, s.bs)
		}
	}
	if len(held) > 0 {
		if r.maglevStrays == nil {
			r.maglevStrays = map[*frontendState][]*backendState{}
		}
		r.maglevStrays[fs] = held
	}
}

// maglevReplaced drops the references fs's restored Maglev table held,
// now that it is replaced or deleted, and returns the strays it held.
func (r *realized) maglevReplaced(fs *frontendState) []*backendState {
	if len(r.maglevStrays) == 0 {
		return nil
	}
	held := r.maglevStrays[fs]
	for _, bs := range held {
		bs.refs--
	}
	delete(r.maglevStrays, fs)
	return held
}

func (r *realized) setByID(bs *backendState) {
	for int(bs.id) >= len(r.backendByID) {
		r.backendByID = append(r.backendByID, nil)
	}
	r.backendByID[bs.id] = bs
}

// byID is the backend, or the stray, of the family is4 with id, or nil.
// IDs are one space for both families, but a slot points into its own
// family's backend map.
func (r *realized) byID(is4 bool, id lbmap.BackendID) *backendState {
	if int(id) < len(r.backendByID) {
		if bs := r.backendByID[id]; bs != nil && bs.addr.Is4 == is4 {
			return bs
		}
	}
	if len(r.strays) == 0 || id == 0 {
		return nil
	}
	if s := r.strays[strayKey{id, is4}]; s != nil {
		return s.bs
	}
	return nil
}

// slotWritten records that slot n of fs, a frontend of the family is4, now
// points at id, moving the reference from the backend it pointed at
// before.
func (r *realized) slotWritten(is4 bool, fs *frontendState, n int, id lbmap.BackendID) {
	for len(fs.slots) < n {
		fs.slots = append(fs.slots, 0)
	}
	r.unref(is4, fs.slots[n-1])
	fs.slots[n-1] = id
	if bs := r.byID(is4, id); bs != nil {
		bs.refs++
	}
}

// slotDeleted records that slot n of fs is gone.
func (r *realized) slotDeleted(is4 bool, fs *frontendState, n int) {
	r.unref(is4, fs.slots[n-1])
	fs.slots[n-1] = 0
	for len(fs.slots) > 0 && fs.slots[len(fs.slots)-1] == 0 {
		fs.slots = fs.slots[:len(fs.slots)-1]
	}
}

// What each kind of write records once the kernel has it: the record
// functions of a round's puts (given the written value) and deletes.
// The slots' and backends' are the round's (they need its family).
func wroteBackend[B any](m mark, _ B)          { m.bs.written = true }
func wroteRevNAT[R any](m mark, _ R)           { m.fs.revNAT = true }
func wroteMaster(m mark, v lbmap.ServiceValue) { m.fs.master, m.fs.hasMaster = v, true }
func deletedMaster(m mark)                     { m.fs.hasMaster = false }
func deletedRevNAT(m mark)                     { m.fs.revNAT = false }

func (r *realized) unref(is4 bool, id lbmap.BackendID) {
	if bs := r.byID(is4, id); bs != nil {
		bs.refs--
	}
}

// empty says nothing of fs is left in the maps.
func (fs *frontendState) empty() bool {
	return !fs.hasMaster && len(fs.slots) == 0 && !fs.revNAT && fs.maglev == 0
}

// maglevHash identifies a Maglev table, to tell whether the one in the map
// is the one wanted without keeping tables in memory.
func maglevHash(table []lbmap.BackendID) uint64 {
	if len(table) == 0 {
		return 0
	}
	buf := make([]byte, 4*len(table))
	for i, id := range table {
		binary.LittleEndian.PutUint32(buf[4*i:], uint32(id))
	}
	return xxhash.Sum64(buf) | 1 // never 0, which means "none"
}

// mapProto is the datapath's protocol number; SCTP has none: the socket
// programs do not balance it.
func mapProto(p loadbalancer.L4Proto) (lbmap.Proto, bool) {
	switch p {
	case loadbalancer.TCP:
		return lbmap.TCP, true
	case loadbalancer.UDP:
		return lbmap.UDP, true
	}
	return 0, false
}

// addrKey is a frontend or backend address as the reconciler's maps key
// it (see addrmap.Key): no pointers, where loadbalancer.L3n4Addr holds one
// (the state of 50,000 services is that much cheaper to garbage collect),
// and its protocol the datapath's number.
type addrKey = addrmap.Key

// describe is a frontend's address as the frontends table writes it,
// 10.96.0.10:80/TCP, for errors.
func describe(a addrKey) string {
	return netip.AddrPortFrom(a.IP(), a.Port).String() + "/" + lbmap.Proto(a.Proto).String()
}

// keyOf is the key of a, and false for protocols the datapath does not
// balance (SCTP).
func keyOf(a loadbalancer.L3n4Addr) (addrKey, bool) {
	proto, ok := mapProto(a.Protocol)
	if !ok {
		return addrKey{}, false
	}
	return addrmap.KeyOf(a.Addr, a.Port, uint8(proto)), true
}

// mapKey is the key of an entry read back from a map.
func mapKey(ap netip.AddrPort, p lbmap.Proto) (addrKey, error) {
	if p != lbmap.TCP && p != lbmap.UDP {
		return addrKey{}, fmt.Errorf("unknown protocol %d", p)
	}
	return addrmap.KeyOf(ap.Addr(), ap.Port(), uint8(p)), nil
}

// restoreStats counts what a restore found.
type restoreStats struct {
	frontends, backends, dropped int
}

// restore reads one family's maps into r. Entries that make no sense (an
// unknown protocol, an ID used twice) are left out of r, so the reconciler
// rewrites what is wanted and prune removes the rest; backend entries so
// left out are strays, deleted once nothing points at them. Backend IDs
// and frontend IDs are reserved here, before any is allocated; the
// leftovers' frontend IDs by holdOrphanIDs, once both families are read.
func restore[SK comparable, B, R any](r *realized, f *family[SK, B, R], stats *restoreStats) error {
	is4 := f.is4
	err := f.backends.Iterate(func(id lbmap.BackendID, b B) bool {
		ap, proto := f.backendOf(b)
		r.restoreBackend(f.is4, id, ap, proto, stats)
		return true
	})
	if err != nil {
		return err
	}

	type slot struct {
		n      uint16
		id     lbmap.BackendID
		revNAT lbmap.RevNATIndex
	}
	type frontend struct {
		addr addrKey
		fs   *frontendState
	}
	// restored are this family's frontends with an ID, for the reverse
	// NAT and Maglev entries to find by it: r.frontends has the other
	// family's too (walking them all again for each family was 50 ms of a
	// 50,000-Service restart).
	var restored []frontend
	slots := map[addrKey][]slot{}
	err = f.services.Iterate(func(k SK, v lbmap.ServiceValue) bool {
		ap, proto, n := f.keyOf(k)
		addr, err := mapKey(ap, proto)
		if err != nil {
			stats.dropped++
			return true
		}
		if n > 0 {
			slots[addr] = append(slots[addr], slot{n, v.BackendID, v.RevNATIndex})
			return true
		}
		if r.frontendIDs.reserve(uint32(v.RevNATIndex)) != nil {
			// Its ID is another frontend's (of either family) or out of
			// range: a frontend with no ID yet, its master known, so
			// that an update gives it an ID and rewrites its entries,
			// and a prune deletes its master with its slots (the
			// datapath would go on matching a master left alone, and
			// refuse the connections).
			r.frontends.Set(addr, &frontendState{master: v, hasMaster: true})
			stats.dropped++
			return true
		}
		fs := &frontendState{id: v.RevNATIndex, master: v, hasMaster: true}
		r.frontends.Set(addr, fs)
		restored = append(restored, frontend{addr, fs})
		stats.frontends++
		return true
	})
	if err != nil {
		return err
	}
	for addr, ss := range slots {
		fs, ok := r.frontends.Get(addr)
		if !ok {
			// Slots without a master (a write cut short): a frontend with
			// no ID yet, so that prune or an update replaces them.
			fs = &frontendState{}
			r.frontends.Set(addr, fs)
		}
		for _, s := range ss {
			// A slot pointing at a stray keeps its ID, which no wanted
			// backend has: it is rewritten or deleted all the same, and
			// holds the stray's entry and ID until then.
			id := s.id
			bs := r.byID(is4, id)
			untrusted := bs != nil && !bs.stray && (s.revNAT != fs.id || fs.id == 0)
			if bs == nil || untrusted {
				id = unknownBackend
			}
			r.slotWritten(is4, fs, int(s.n), id)
			if untrusted {
				if r.untrusted == nil {
					r.untrusted = map[slotKey]*backendState{}
				}
				bs.refs++
				r.untrusted[slotKey{fs, int(s.n)}] = bs
			}
		}
	}

	byID := make(map[lbmap.RevNATIndex]frontend, len(restored))
	for _, fe := range restored {
		byID[fe.fs.id] = fe
	}
	err = f.revNAT.Iterate(func(id lbmap.RevNATIndex, v R) bool {
		fe, ok := byID[id]
		if !ok {
			r.orphans = append(r.orphans, orphan{
				id: id, remove: func() error { return f.revNAT.Delete(id) },
				object: "lb-revnat", what: fmt.Sprintf("reverse NAT %d %s", id, f.revNATAddr(v)),
				where: f.revNAT.Name(), why: "no " + familyName(is4) + " frontend has its ID",
			})
			return true
		}
		ap := f.revNATAddr(v)
		fe.fs.revNAT = ap.Addr().Unmap() == fe.addr.IP() && ap.Port() == fe.addr.Port
		return true
	})
	if err != nil {
		return err
	}
	var maglevIDs []lbmap.RevNATIndex
	if err := f.maglev.Iterate(func(id lbmap.RevNATIndex) bool {
		maglevIDs = append(maglevIDs, id)
		return true
	}); err != nil {
		return err
	}
	for _, id := range maglevIDs {
		fe, ok := byID[id]
		if !ok {
			r.orphans = append(r.orphans, orphan{
				id: id, remove: func() error { return f.maglev.Delete(id) },
				object: "lb-maglev", what: fmt.Sprintf("Maglev table %d", id),
				where: f.maglev.Name(), why: "no " + familyName(is4) + " frontend has its ID",
			})
			continue
		}
		table, err := f.maglev.Lookup(id)
		if err != nil {
			return err
		}
		fe.fs.maglev = maglevHash(table)
		if len(r.strays) > 0 {
			r.holdMaglevStrays(is4, fe.fs, table)
		}
	}
	return nil
}

// restoreBackend adopts the backend entry id of the family is4, or makes
// it a stray.
func (r *realized) restoreBackend(is4 bool, id lbmap.BackendID, ap netip.AddrPort, proto lbmap.Proto, stats *restoreStats) {
	addr, err := mapKey(ap, proto)
	var why string
	switch {
	case err != nil:
		why = err.Error()
	case addr.Is4 != is4:
		why = "an address of the other family"
	case id == 0 || uint32(id) > r.backendIDs.max:
		why = fmt.Sprintf("ID out of range 1..%d", r.backendIDs.max)
	case r.adoptedAt(id) != nil:
		other := r.adoptedAt(id)
		why = fmt.Sprintf("its ID is the %s backend %s's too", familyName(other.addr.Is4), describe(other.addr))
	}
	if why == "" {
		if dup, ok := r.backends.Get(addr); ok && dup.id < id {
			why = fmt.Sprintf("its address is at backend ID %d too", dup.id)
		} else if ok {
			// One address at two IDs: the lower one is kept, whatever
			// order the map gives them in.
			r.backends.Delete(addr)
			r.backendByID[dup.id] = nil
			r.addStray(is4, dup.id, dup.addr, fmt.Sprintf("backend %d %s", dup.id, describe(dup.addr)),
				fmt.Sprintf("its address is at backend ID %d too", id))
			stats.backends--
			stats.dropped++
		}
	}
	if why != "" {
		r.addStray(is4, id, addrmap.KeyOf(ap.Addr(), ap.Port(), uint8(proto)),
			fmt.Sprintf("backend %d %s/%s", id, ap, proto), why)
		stats.dropped++
		return
	}
	_ = r.backendIDs.reserve(uint32(id)) // fails where a stray of the other family holds it
	bs := &backendState{addr: addr, id: id, written: true}
	r.backends.Set(addr, bs)
	r.setByID(bs)
	stats.backends++
}

func familyName(is4 bool) string {
	if is4 {
		return "IPv4"
	}
	return "IPv6"
}
