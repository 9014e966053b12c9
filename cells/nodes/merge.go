package nodes

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
)

// claims are what every source says of every node, kept by the sources'
// jobs; merge turns them into the table's rows.
type claims struct {
	mu    sync.Mutex
	local string
	specs map[string]map[Source]Spec
	// changed is signalled (never blocks) when a claim changes.
	changed chan struct{}
}

func newClaims(local string) *claims {
	return &claims{local: local, specs: map[string]map[Source]Spec{}, changed: make(chan struct{}, 1)}
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
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// rows are the nodes as the table must hold them: each node as its
// strongest source describes it (with what it leaves empty from weaker
// ones), without what cannot be used. A node
// without address keeps its row, named unusable in its problems. A pod
// CIDR that overlaps one of this node's, or one of another node whose name
// sorts first, is left out: a route for it would take another node's pods.
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
	c.mu.Unlock()

	type owned struct {
		cidr netip.Prefix
		node string
	}
	var taken []owned
	names := slices.Sorted(maps.Keys(out))
	// The local node's pod CIDRs first: they are this node's, whatever
	// anyone else says.
	slices.SortStableFunc(names, func(a, b string) int {
		return cmp.Compare(boolRank(!out[a].Local), boolRank(!out[b].Local))
	})
	for _, name := range names {
		n := out[name]
		if len(n.Addresses) == 0 {
			n.Problems = append(n.Problems, "no InternalIP or ExternalIP address: other nodes cannot reach it")
		}
		var kept []netip.Prefix
		for _, cidr := range n.PodCIDRs {
			i := slices.IndexFunc(taken, func(o owned) bool { return o.cidr.Overlaps(cidr) })
			if i >= 0 {
				n.Problems = append(n.Problems, fmt.Sprintf("pod CIDR %s ignored: it overlaps %s of node %s", cidr, taken[i].cidr, taken[i].node))
				continue
			}
			taken = append(taken, owned{cidr, name})
			kept = append(kept, cidr)
		}
		n.PodCIDRs = kept
	}
	return out
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}
