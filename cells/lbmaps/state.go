package lbmaps

import (
	"encoding/binary"
	"fmt"
	"net/netip"

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
}

// orphan is one leftover entry at a frontend ID, and how to delete it.
type orphan struct {
	id     lbmap.RevNATIndex
	remove func() error
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

// forgetBackend drops a backend whose entry is gone.
func (r *realized) forgetBackend(bs *backendState) {
	r.backends.Delete(bs.addr)
	r.backendByID[bs.id] = nil
	r.backendIDs.release(uint32(bs.id))
}

func (r *realized) setByID(bs *backendState) {
	for int(bs.id) >= len(r.backendByID) {
		r.backendByID = append(r.backendByID, nil)
	}
	r.backendByID[bs.id] = bs
}

// byID is the backend with id, or nil.
func (r *realized) byID(id lbmap.BackendID) *backendState {
	if int(id) < len(r.backendByID) {
		return r.backendByID[id]
	}
	return nil
}

// slotWritten records that slot n of fs now points at id, moving the
// reference from the backend it pointed at before.
func (r *realized) slotWritten(fs *frontendState, n int, id lbmap.BackendID) {
	for len(fs.slots) < n {
		fs.slots = append(fs.slots, 0)
	}
	r.unref(fs.slots[n-1])
	fs.slots[n-1] = id
	if bs := r.byID(id); bs != nil {
		bs.refs++
	}
}

// slotDeleted records that slot n of fs is gone.
func (r *realized) slotDeleted(fs *frontendState, n int) {
	r.unref(fs.slots[n-1])
	fs.slots[n-1] = 0
	for len(fs.slots) > 0 && fs.slots[len(fs.slots)-1] == 0 {
		fs.slots = fs.slots[:len(fs.slots)-1]
	}
}

// What each kind of write records once the kernel has it: the record
// functions of a round's puts (given the written value) and deletes.
func wroteBackend[B any](m mark, _ B)                      { m.bs.written = true }
func wroteRevNAT[R any](m mark, _ R)                       { m.fs.revNAT = true }
func wroteMaster(m mark, v lbmap.ServiceValue)             { m.fs.master, m.fs.hasMaster = v, true }
func (r *realized) wroteSlot(m mark, v lbmap.ServiceValue) { r.slotWritten(m.fs, m.slot, v.BackendID) }
func deletedMaster(m mark)                                 { m.fs.hasMaster = false }
func deletedRevNAT(m mark)                                 { m.fs.revNAT = false }
func (r *realized) deletedSlot(m mark)                     { r.slotDeleted(m.fs, m.slot) }
func (r *realized) deletedBackend(m mark)                  { r.forgetBackend(m.bs) }

func (r *realized) unref(id lbmap.BackendID) {
	if bs := r.byID(id); bs != nil {
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
// rewrites what is wanted and prune removes the rest. Backend IDs and
// frontend IDs are reserved here, before any is allocated; the leftovers'
// frontend IDs by holdOrphanIDs, once both families are read.
func restore[SK comparable, B, R any](r *realized, f *family[SK, B, R], stats *restoreStats) error {
	err := f.backends.Iterate(func(id lbmap.BackendID, b B) bool {
		ap, proto := f.backendOf(b)
		addr, err := mapKey(ap, proto)
		if err != nil || r.backendIDs.reserve(uint32(id)) != nil {
			stats.dropped++
			return true
		}
		if _, dup := r.backends.Get(addr); dup {
			// Two IDs for one backend: keep the first; slots pointing at
			// the other are rewritten.
			r.backendIDs.release(uint32(id))
			stats.dropped++
			return true
		}
		bs := &backendState{addr: addr, id: id, written: true}
		r.backends.Set(addr, bs)
		r.setByID(bs)
		stats.backends++
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
			id := s.id
			if r.byID(id) == nil || s.revNAT != fs.id || fs.id == 0 {
				id = unknownBackend
			}
			r.slotWritten(fs, int(s.n), id)
		}
	}

	byID := make(map[lbmap.RevNATIndex]frontend, len(restored))
	for _, fe := range restored {
		byID[fe.fs.id] = fe
	}
	err = f.revNAT.Iterate(func(id lbmap.RevNATIndex, v R) bool {
		fe, ok := byID[id]
		if !ok {
			r.orphans = append(r.orphans, orphan{id, func() error { return f.revNAT.Delete(id) }})
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
			r.orphans = append(r.orphans, orphan{id, func() error { return f.maglev.Delete(id) }})
			continue
		}
		table, err := f.maglev.Lookup(id)
		if err != nil {
			return err
		}
		fe.fs.maglev = maglevHash(table)
	}
	return nil
}
