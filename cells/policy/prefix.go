package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/policymap"
)

// Prefix is one row of the table "policy-prefixes": an address prefix an
// ipBlock names (its cidr or an except), with the ID that policy entries
// hold in place of an identity. The datapath resolves a peer's address to
// the ID of its longest prefix (bpf/include/policy.h); the policy-maps
// cell writes the rows into that trie.
type Prefix struct {
	Prefix netip.Prefix
	ID     identity.NumericIdentity
	Status reconciler.Status
}

func (p *Prefix) TableHeader() []string { return []string{"Prefix", "ID", "Status"} }

func (p *Prefix) TableRow() []string {
	return []string{p.Prefix.String(), p.ID.String(), p.Status.String()}
}

func (p *Prefix) Clone() *Prefix { c := *p; return &c }

// PrefixByPrefix is the primary index of "policy-prefixes".
var PrefixByPrefix = statedb.Index[*Prefix, netip.Prefix]{
	Name:       "prefix",
	FromObject: func(p *Prefix) index.KeySet { return index.NewKeySet(index.NetIPPrefix(p.Prefix)) },
	FromKey:    index.NetIPPrefix,
	FromString: index.NetIPPrefixString,
	Unique:     true,
}

// NewPrefixesTable registers the table "policy-prefixes".
func NewPrefixesTable(db *statedb.DB) (statedb.RWTable[*Prefix], error) {
	return statedb.NewTable(db, "policy-prefixes", PrefixByPrefix)
}

// key is the ipBlock's text: the same for equal blocks of any policy.
func (b IPBlock) key() string {
	if len(b.Except) == 0 {
		return b.CIDR.String()
	}
	ex := make([]string, len(b.Except))
	for i, e := range b.Except {
		ex[i] = e.String()
	}
	slices.Sort(ex)
	return b.CIDR.String() + " except " + strings.Join(ex, ",")
}

// prefixes are the block's cidr and excepts: what it brings into the
// node's set of prefixes.
func (b IPBlock) prefixes() []netip.Prefix {
	return append([]netip.Prefix{b.CIDR}, b.Except...)
}

// selects says whether the block selects the prefix p of the node's set:
// p inside the cidr and inside none of the excepts. With the cidr and the
// excepts in the set, an address's longest prefix is then selected
// exactly when the address is in the block.
func (b IPBlock) selects(p netip.Prefix) bool {
	if !within(p, b.CIDR) {
		return false
	}
	for _, e := range b.Except {
		if within(p, e) {
			return false
		}
	}
	return true
}

// within says whether p is inside q (or is q).
func within(p, q netip.Prefix) bool {
	return p.Addr().Is4() == q.Addr().Is4() && p.Bits() >= q.Bits() && q.Contains(p.Addr())
}

// prefixEntry is a prefix of the node's set: its ID and the blocks that
// name it.
type prefixEntry struct {
	id   identity.NumericIdentity
	refs int
}

// cachedBlock is an ipBlock of the applied policies, the prefix IDs it
// selects and the policies that use it.
type cachedBlock struct {
	block IPBlock
	ids   map[identity.NumericIdentity]struct{}
	users map[string]struct{}
}

// prefixCache is the ipBlocks' side of the selector cache: the node's set
// of prefixes (every cidr and except of the applied policies) and, for
// each ipBlock, the prefix IDs it selects. A prefix coming or going is to
// the blocks what an identity is to the selectors.
type prefixCache struct {
	prefixes map[netip.Prefix]*prefixEntry
	ids      map[identity.NumericIdentity]netip.Prefix
	blocks   map[string]*cachedBlock
	// added and removed are the prefixes to write into or delete from
	// the table at the next flush.
	added   map[netip.Prefix]struct{}
	removed map[netip.Prefix]struct{}
}

func newPrefixCache() *prefixCache {
	return &prefixCache{
		prefixes: map[netip.Prefix]*prefixEntry{}, ids: map[identity.NumericIdentity]netip.Prefix{},
		blocks: map[string]*cachedBlock{}, added: map[netip.Prefix]struct{}{}, removed: map[netip.Prefix]struct{}{},
	}
}

// acquire counts user as a user of b; a new block brings its prefixes in.
// changed is called with each block whose selection grew and the ID.
func (c *prefixCache) acquire(b IPBlock, user string, changed func(*cachedBlock, identity.NumericIdentity)) {
	key := b.key()
	cb, ok := c.blocks[key]
	if !ok {
		cb = &cachedBlock{block: b, ids: map[identity.NumericIdentity]struct{}{}, users: map[string]struct{}{}}
		c.blocks[key] = cb
		for p, pe := range c.prefixes {
			if b.selects(p) {
				cb.ids[pe.id] = struct{}{}
			}
		}
		for _, p := range b.prefixes() {
			c.ref(p, changed)
		}
	}
	cb.users[user] = struct{}{}
}

// release drops user's use of the block key; the last user removes the
// block and its references to its prefixes.
func (c *prefixCache) release(key, user string, changed func(*cachedBlock, identity.NumericIdentity)) {
	cb, ok := c.blocks[key]
	if !ok {
		return
	}
	delete(cb.users, user)
	if len(cb.users) > 0 {
		return
	}
	delete(c.blocks, key)
	for _, p := range cb.block.prefixes() {
		c.unref(p, changed)
	}
}

func (c *prefixCache) ref(p netip.Prefix, changed func(*cachedBlock, identity.NumericIdentity)) {
	if pe, ok := c.prefixes[p]; ok {
		pe.refs++
		return
	}
	id := identity.NumericIdentity(policymap.PrefixID(p, func(id uint32) bool {
		_, taken := c.ids[identity.NumericIdentity(id)]
		return taken
	}))
	c.prefixes[p] = &prefixEntry{id: id, refs: 1}
	c.ids[id] = p
	delete(c.removed, p)
	c.added[p] = struct{}{}
	for _, cb := range c.blocks {
		if cb.block.selects(p) {
			cb.ids[id] = struct{}{}
			changed(cb, id)
		}
	}
}

func (c *prefixCache) unref(p netip.Prefix, changed func(*cachedBlock, identity.NumericIdentity)) {
	pe, ok := c.prefixes[p]
	if !ok {
		return
	}
	if pe.refs--; pe.refs > 0 {
		return
	}
	delete(c.prefixes, p)
	delete(c.ids, pe.id)
	delete(c.added, p)
	c.removed[p] = struct{}{}
	for _, cb := range c.blocks {
		if _, ok := cb.ids[pe.id]; ok {
			delete(cb.ids, pe.id)
			changed(cb, pe.id)
		}
	}
}

// selection are the prefix IDs the block key selects (nil for an unknown
// key); the caller does not change it.
func (c *prefixCache) selection(key string) map[identity.NumericIdentity]struct{} {
	if cb, ok := c.blocks[key]; ok {
		return cb.ids
	}
	return nil
}

// lookup is the ID of the longest prefix of the set that holds addr, as
// the datapath finds it; false if none does.
func (c *prefixCache) lookup(addr netip.Addr) (identity.NumericIdentity, bool) {
	for bits := addr.BitLen(); bits >= 0; bits-- {
		p, _ := addr.Prefix(bits)
		if pe, ok := c.prefixes[p]; ok {
			return pe.id, true
		}
	}
	return 0, false
}

// flush writes the prefixes added and deleted since the last flush:
// deletes shorter prefixes first and writes longer ones first, so that
// the reconciler, which goes in revision order, never has a cidr in the
// trie without the excepts inside it (a trie filling up refuses the cidr,
// not its except; see policy-maps' prefixOps).
func (c *prefixCache) flush(wtxn statedb.WriteTxn, tbl statedb.RWTable[*Prefix]) error {
	byBits := func(a, b netip.Prefix) int {
		if a.Bits() != b.Bits() {
			return a.Bits() - b.Bits()
		}
		return a.Addr().Compare(b.Addr())
	}
	for _, p := range slices.SortedFunc(maps.Keys(c.removed), byBits) {
		if _, _, err := tbl.Delete(wtxn, &Prefix{Prefix: p}); err != nil {
			return fmt.Errorf("delete prefix %s: %w", p, err)
		}
	}
	added := slices.SortedFunc(maps.Keys(c.added), byBits)
	slices.Reverse(added)
	for _, p := range added {
		if _, _, err := tbl.Insert(wtxn, &Prefix{Prefix: p, ID: c.prefixes[p].id, Status: reconciler.StatusPending()}); err != nil {
			return fmt.Errorf("write prefix %s: %w", p, err)
		}
	}
	clear(c.removed)
	clear(c.added)
	return nil
}
