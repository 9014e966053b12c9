package nodes

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/statedb"
)

// claims are what every source says of every node, kept by the sources'
// jobs; merge turns them into the table's rows.
type claims struct {
	mu    sync.Mutex
	local string
	specs map[string]map[Source]Spec
	// held are the pod CIDRs as the last rows gave them, to their node.
	held map[netip.Prefix]string
	// created is when each node's kvstore key was created (its create
	// revision): the age of its claims, which outlasts a restart of this
	// agent where held does not.
	created map[string]int64
	// listing is true until every kvstore key has been read once: rows
	// made from part of them (the keys come in batches) must not count as
	// held, or a key that sorts first would hold a CIDR that an older key
	// of a node read later has a stronger claim on.
	listing bool
	// complete are the table's initializers of the sources that have
	// given every claim they had at start; the merge marks them in the
	// transaction that writes the rows made from those claims, so that
	// the table is never initialized without them (the routing, which
	// prunes once the table is initialized, would remove the routes to
	// nodes it did not see yet).
	complete []func(statedb.WriteTxn)
	// changed is signalled (never blocks) when a claim changes.
	changed chan struct{}
}

// newClaims are the claims of local's agent; with listing, none is held
// before listed.
func newClaims(local string, listing bool) *claims {
	return &claims{local: local, specs: map[string]map[Source]Spec{}, created: map[string]int64{}, listing: listing,
		changed: make(chan struct{}, 1)}
}

// listed says every kvstore key has been read once: from now on the rows'
// CIDRs are held, and the merge marks initialized with them.
func (c *claims) listed(initialized func(statedb.WriteTxn)) {
	c.mu.Lock()
	c.listing = false
	c.complete = append(c.complete, initialized)
	c.mu.Unlock()
	c.signal()
}

// synced says a source has given every claim it had at start: the merge
// marks initialized with the rows made from them.
func (c *claims) synced(initialized func(statedb.WriteTxn)) {
	c.mu.Lock()
	c.complete = append(c.complete, initialized)
	c.mu.Unlock()
	c.signal()
}

// takeComplete returns the initializers given by listed and synced since
// the last call. Taken before rows, they come with every claim made
// before them.
func (c *claims) takeComplete() []func(statedb.WriteTxn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	done := c.complete
	c.complete = nil
	return done
}

// signal wakes the merge (never blocks).
func (c *claims) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// setCreated records when node's kvstore key was created; 0 forgets it. It
// takes effect with the next set.
func (c *claims) setCreated(node string, rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev == 0 {
		delete(c.created, node)
		return
	}
	c.created[node] = rev
}

// set records what source says of node; ok false removes it.
func (c *claims) set(node string, source Source, spec Spec, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bySource := c.specs[node]
	if old, had := bySource[source]; had == ok && (!ok || old.equal(spec)) {
		return
	}
	if ok {
		if bySource == nil {
			bySource = map[Source]Spec{}
			c.specs[node] = bySource
		}
		bySource[source] = spec
	} else {
		delete(bySource, source)
		if len(bySource) == 0 {
			delete(c.specs, node)
		}
	}
	c.signal()
}

// rows are the nodes as the table must hold them: each node as its
// strongest source describes it (with what it leaves empty from weaker
// ones), without what cannot be used. A node without address keeps its
// row, named unusable in its problems. A pod CIDR that overlaps one that
// another node has a stronger claim on (see below) is left out, and said
// in the node's problems: a route for it would take another node's pods.
func (c *claims) rows() map[string]*Node {
	c.mu.Lock()
	out := make(map[string]*Node, len(c.specs))
	for name, bySource := range c.specs {
		sources := slices.Sorted(maps.Keys(bySource))
		slices.Reverse(sources)
		n := &Node{Name: name, Local: name == c.local, Source: sources[0], Spec: bySource[sources[0]]}
		// What the strongest source lacks, a weaker one may say: a Node
		// object without the agent's annotations, say, and its node's key.
		for _, src := range sources[1:] {
			s := bySource[src]
			if len(n.Addresses) == 0 {
				n.Addresses = s.Addresses
			}
			if len(n.PodCIDRs) == 0 {
				n.PodCIDRs = s.PodCIDRs
			}
			if len(n.HealthIPs) == 0 {
				n.HealthIPs = s.HealthIPs
			}
		}
		out[name] = n
	}

	// Who gets a pod CIDR that several nodes claim: this node (its CIDRs
	// are its own, whatever anyone else says), then a node whose Node
	// object gives it, then the node that held it until now, then the node
	// whose kvstore key is oldest (so an agent that starts anew ranks them
	// as the running ones do); only then the node whose name sorts first.
	// A key that appears with another node's CIDR, whatever its name,
	// cannot take it from that node.
	type candidate struct {
		cidr netip.Prefix
		node string
		rank int
	}
	var cands []candidate
	for name, n := range out {
		for _, cidr := range n.PodCIDRs {
			rank := 3
			switch {
			case n.Local:
				rank = 0
			case slices.Contains(c.specs[name][SourceK8s].PodCIDRs, cidr):
				rank = 1
			case c.held[cidr] == name:
				rank = 2
			}
			cands = append(cands, candidate{cidr, name, rank})
		}
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(c.age(a.node), c.age(b.node)), strings.Compare(a.node, b.node),
			a.cidr.Addr().Compare(b.cidr.Addr()), cmp.Compare(a.cidr.Bits(), b.cidr.Bits()))
	})
	held := map[netip.Prefix]string{}
	refused := map[string][]string{}
	var taken []candidate
	for _, cand := range cands {
		if i := slices.IndexFunc(taken, func(o candidate) bool { return o.cidr.Overlaps(cand.cidr) }); i >= 0 {
			refused[cand.node] = append(refused[cand.node], fmt.Sprintf("pod CIDR %s ignored: it overlaps %s of node %s", cand.cidr, taken[i].cidr, taken[i].node))
			continue
		}
		taken = append(taken, cand)
		held[cand.cidr] = cand.node
	}
	if !c.listing {
		c.held = held
	}
	for name, n := range out {
		if len(n.Addresses) == 0 {
			n.Problems = append(n.Problems, "no InternalIP or ExternalIP address: other nodes cannot reach it")
		}
		n.Problems = append(n.Problems, refused[name]...)
		n.PodCIDRs = slices.DeleteFunc(slices.Clone(n.PodCIDRs), func(p netip.Prefix) bool { return held[p] != name })
	}
	c.mu.Unlock()
	return out
}

// age orders nodes by when their kvstore key was created, oldest first; a
// node without one (or not yet known) after every node with one.
func (c *claims) age(node string) int64 {
	if rev, ok := c.created[node]; ok {
		return rev
	}
	return math.MaxInt64
}
