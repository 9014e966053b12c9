package ctgc

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// chunkSize is the number of entries a walk reads per system call. Larger
// chunks save system calls up to about this size, past which the walk is
// bound by copying entries (`make bench-ctgc` prints the figures).
const chunkSize = 4096

// progressEvery is how often a walk that takes long logs how far it got.
const progressEvery = 10 * time.Second

// reason is why a sweep deletes an entry, or keep.
type reason uint8

const (
	keep reason = iota
	expired
	endpointGone
	flushed
	endpointDeleted
	numReasons
)

var reasonNames = [numReasons]string{keep: "keep", expired: "expired", endpointGone: "endpoint_gone", flushed: "flush",
	endpointDeleted: "endpoint_deleted"}

func (r reason) String() string { return reasonNames[r] }

// judge decides the fate of each entry of a sweep.
type judge struct {
	// now is CLOCK_BOOTTIME in seconds when the pass began: an entry
	// whose lifetime ends before it has expired.
	now uint32
	// endpoints, on the first pass only, tells endpoints that are gone.
	endpoints *endpointCheck
	// flush deletes everything.
	flush bool
	// deleted, when set, are the addresses of endpoints deleted: the
	// judge deletes the entries with one of them as source or
	// destination, and nothing else.
	deleted *addrSet
}

// addrSet is a set of addresses by family, as the conntrack keys hold
// them.
type addrSet struct {
	v4 map[[4]byte]struct{}
	v6 map[[16]byte]struct{}
}

func newAddrSet(addrs []netip.Addr) *addrSet {
	s := &addrSet{v4: map[[4]byte]struct{}{}, v6: map[[16]byte]struct{}{}}
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			s.v4[a.As4()] = struct{}{}
		} else if a.Is6() {
			s.v6[a.As16()] = struct{}{}
		}
	}
	return s
}

func has[A comparable](set map[A]struct{}, a A) bool {
	_, ok := set[a]
	return ok
}

func (j *judge) verdict4(k *ctmap.Key4, e *ctmap.Entry) reason {
	if j.deleted != nil {
		if has(j.deleted.v4, k.SrcAddr) || has(j.deleted.v4, k.DstAddr) {
			return endpointDeleted
		}
		return keep
	}
	return j.verdict(e)
}

func (j *judge) verdict6(k *ctmap.Key6, e *ctmap.Entry) reason {
	if j.deleted != nil {
		if has(j.deleted.v6, k.SrcAddr) || has(j.deleted.v6, k.DstAddr) {
			return endpointDeleted
		}
		return keep
	}
	return j.verdict(e)
}

func (j *judge) verdict(e *ctmap.Entry) reason {
	switch {
	case j.flush:
		return flushed
	case e.Lifetime < j.now:
		return expired
	case j.endpoints != nil && e.EndpointID != 0 && j.endpoints.gone(e.EndpointID):
		return endpointGone
	}
	return keep
}

// natVerdict judges an entry of the NodePort NAT map, which belongs to no
// endpoint and is never flushed: only its lifetime counts. The two entries
// of a connection carry the same lifetime, so both go in the same pass;
// neither is deleted for the other's sake, since an expired entry's pair
// key may already be a new connection's (the datapath takes expired SNAT
// ports over).
func (j *judge) natVerdict(_ *nodeportmap.Key4, v *nodeportmap.NAT4) reason {
	if v.Expired(j.now) {
		return expired
	}
	return keep
}

// chunkRead is called after each chunk is read.
func (j *judge) chunkRead() {
	if j.endpoints != nil {
		j.endpoints.chunkRead()
	}
}

// endpointCheck says whether endpoints are gone from the endpoints table.
//
// An endpoint's row is in the table before the datapath can tag any entry
// with its ID, so an ID is gone only if a snapshot taken after the entry was
// read lacks it: the check takes a fresh snapshot for each chunk, when it
// meets the chunk's first ID not known to exist, and never deletes the
// entries of an endpoint created during the pass.
type endpointCheck struct {
	db        *statedb.DB
	endpoints statedb.Table[*endpointmanager.Endpoint]
	txn       statedb.ReadTxn
	// exists is true for the IDs found in the table; false for those not
	// found in txn.
	exists map[uint16]bool
}

func newEndpointCheck(db *statedb.DB, endpoints statedb.Table[*endpointmanager.Endpoint]) *endpointCheck {
	return &endpointCheck{db: db, endpoints: endpoints, exists: map[uint16]bool{}}
}

func (c *endpointCheck) chunkRead() {
	c.txn = nil
	for id, exists := range c.exists {
		if !exists {
			delete(c.exists, id)
		}
	}
}

func (c *endpointCheck) gone(id uint16) bool {
	exists, known := c.exists[id]
	if !known {
		if c.txn == nil {
			c.txn = c.db.ReadTxn()
		}
		_, _, exists = c.endpoints.Get(c.txn, endpointmanager.EndpointID.Query(id))
		c.exists[id] = exists
	}
	return !exists
}

// chunk holds a chunk of a walk and the keys to delete from it. Its slices
// are reused from chunk to chunk and pass to pass.
type chunk[K, V any] struct {
	keys    []K
	entries []V
	doomed  []K
	reasons []reason
}

func newChunk[K, V any](size int) *chunk[K, V] {
	return &chunk[K, V]{
		keys:    make([]K, size),
		entries: make([]V, size),
		doomed:  make([]K, 0, size),
		reasons: make([]reason, 0, size),
	}
}

// buffers are the two chunks of a walk: the walk reads into one while the
// entries the other condemned are being deleted.
type buffers[K, V any] [2]*chunk[K, V]

func newBuffers[K, V any](size int) buffers[K, V] {
	return buffers[K, V]{newChunk[K, V](size), newChunk[K, V](size)}
}

// walk is a sweep's map and how to judge its entries.
type walk[K, V any] struct {
	m    *bpfmaps.Map[K, V]
	bufs buffers[K, V]
	// verdict is the fate of an entry.
	verdict func(*K, *V) reason
	// confirm, when set, is asked again just before an entry is deleted,
	// which is then deleted alone: for a map whose keys the datapath may
	// give to a new connection between the walk reading and deleting
	// them.
	confirm func(K) bool
}

// swept is what a sweep did in one map.
type swept struct {
	Map      string
	Capacity int
	Scanned  int
	Deleted  [numReasons]int
}

// progress logs, during a long walk, how far it got: a pass over full maps
// of the default sizes (1.5 million entries) takes well under a second, but
// one that takes much longer (huge maps, a machine short of CPU) should not
// look like a hang.
type progress struct {
	log *slog.Logger
	// what is the walk, "pass 3" or "flush".
	what  string
	every time.Duration
	start time.Time
	next  time.Time
}

func newProgress(log *slog.Logger, what string, every time.Duration) *progress {
	now := time.Now()
	return &progress{log: log, what: what, every: every, start: now, next: now.Add(every)}
}

// chunkRead is called after each chunk of a map, with the map's figures so
// far.
func (p *progress) chunkRead(m string, capacity, scanned, condemned int) {
	if now := time.Now(); !now.Before(p.next) {
		p.next = now.Add(p.every)
		p.log.Info("Conntrack garbage collection in progress", "walk", p.what, "map", m, "capacity", capacity,
			"scanned", scanned, "condemned", condemned, "elapsed", now.Sub(p.start).Round(time.Millisecond))
	}
}

// long says whether the walk took long enough to have logged progress.
func (p *progress) long() bool { return time.Since(p.start) >= p.every }

// sweep walks m with batch lookups, one chunk at a time, and deletes the
// entries that j condemns with a batch delete per chunk.
//
// The walk and the deletes overlap: a goroutine deletes what one chunk
// condemned while the walk reads the next chunk into the other buffer, so
// that a pass costs about what reading the map costs (`make bench-ctgc`).
// Deleting entries of chunks already read does not disturb the walk, which
// goes bucket by bucket: see bpfmaps.Map.BatchLookup.
func sweep[K, V any](w walk[K, V], j *judge, prog *progress) (swept, error) {
	m, bufs := w.m, w.bufs
	s := swept{Map: m.Name()}
	if em := m.EBPF(); em != nil {
		s.Capacity = int(em.MaxEntries())
	}

	free := make(chan *chunk[K, V], len(bufs))
	for _, c := range bufs {
		free <- c
	}
	// The deleter owns a chunk from its send on condemned until it gives
	// it back on free.
	condemned := make(chan *chunk[K, V], len(bufs))
	type result struct {
		deleted [numReasons]int
		err     error
	}
	deleted := make(chan result, 1)
	var failed atomic.Bool
	go func() {
		var r result
		for c := range condemned {
			if r.err == nil {
				if r.err = deleteKeys(w, c, &r.deleted); r.err != nil {
					failed.Store(true)
				}
			}
			free <- c
		}
		deleted <- r
	}()

	var (
		cursor bpfmaps.BatchCursor
		err    error
		doomed int
	)
	for done := false; !done && !failed.Load(); {
		c := <-free
		var n int
		n, done, err = m.BatchLookup(&cursor, c.keys, c.entries)
		if err != nil {
			break
		}
		s.Scanned += n
		j.chunkRead()
		c.doomed, c.reasons = c.doomed[:0], c.reasons[:0]
		for i := range n {
			if r := w.verdict(&c.keys[i], &c.entries[i]); r != keep {
				c.doomed = append(c.doomed, c.keys[i])
				c.reasons = append(c.reasons, r)
			}
		}
		doomed += len(c.doomed)
		condemned <- c
		if prog != nil {
			prog.chunkRead(s.Map, s.Capacity, s.Scanned, doomed)
		}
	}
	close(condemned)
	r := <-deleted
	s.Deleted = r.deleted
	return s, errors.Join(err, r.err)
}

// deleteKeys deletes c's doomed keys and counts them by reason. A key that
// is already gone (the LRU evicted it, the datapath closed it) is skipped.
func deleteKeys[K, V any](w walk[K, V], c *chunk[K, V], deleted *[numReasons]int) error {
	m := w.m
	if w.confirm != nil {
		for i, k := range c.doomed {
			if !w.confirm(k) {
				continue
			}
			err := m.Delete(k)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("delete %v: %w", k, err)
			}
			deleted[c.reasons[i]]++
		}
		return nil
	}
	for start := 0; start < len(c.doomed); {
		n, err := m.BatchDelete(c.doomed[start:])
		for _, r := range c.reasons[start : start+n] {
			deleted[r]++
		}
		start += n
		if err == nil {
			return nil
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete %d entries: %w", len(c.doomed)-start, err)
		}
		start++
	}
	return nil
}
