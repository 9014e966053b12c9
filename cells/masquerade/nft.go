package masquerade

import (
	"bytes"
	"fmt"
	"math/big"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The agent's nftables objects. The table is the agent's alone: whatever
// in it the agent does not want, it removes.
const (
	TableName = "cellium"
	ChainName = "postrouting"
)

// ruleVersion is in each rule's user data: a rule written by an agent
// whose rules differ carries another, and is replaced.
const ruleVersion = "v1"

// Want is the kernel state for one family: masquerade what comes from a
// Source prefix and goes to none of the Excluded ones.
type Want struct {
	Source, Excluded []netip.Prefix
}

// Ruleset is what the agent wants in its nftables table. Without Enabled,
// no table. Enabled with no source keeps the table, sets empty: deleting
// the last nat chain of a namespace would stop the translation of the
// connections already masqueraded.
type Ruleset struct {
	Enabled bool
	V4, V6  Want
}

// family is the per-family shape of the table: two sets and one rule.
type family struct {
	name             string // v4, v6
	nfproto          byte
	keyType          nftables.SetDatatype
	saddrOff, daddrO uint32
	addrLen          uint32
}

var families = []family{
	{"v4", unix.NFPROTO_IPV4, nftables.TypeIPAddr, 12, 16, 4},
	{"v6", unix.NFPROTO_IPV6, nftables.TypeIP6Addr, 8, 24, 16},
}

func (f family) want(r Ruleset) Want {
	if f.name == "v4" {
		return r.V4
	}
	return r.V6
}

func (f family) sourceSet() string   { return "pods" + f.name[1:] }
func (f family) excludedSet() string { return "nomasq" + f.name[1:] }
func (f family) ruleTag() []byte     { return []byte("cellium-masquerade-" + f.name + "-" + ruleVersion) }

// Kernel writes a Ruleset into the agent's nftables table, changing only
// what differs from what is there.
type Kernel struct {
	conn func() (*nftables.Conn, error)
}

// NewKernel works in the network namespace of netnsFD, or the current
// one for -1.
func NewKernel(netnsFD int) *Kernel {
	return &Kernel{conn: func() (*nftables.Conn, error) {
		if netnsFD < 0 {
			return nftables.New()
		}
		return nftables.New(nftables.WithNetNSFd(netnsFD))
	}}
}

var table = &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}

// Sync makes the table match want and returns what it changed (nothing
// when the kernel was right).
func (k *Kernel) Sync(want Ruleset) ([]string, error) {
	c, err := k.conn()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	have, err := ourTable(c)
	if err != nil {
		return nil, err
	}
	if !want.Enabled {
		if have == nil {
			return nil, nil
		}
		c.DelTable(table)
		if err := c.Flush(); err != nil {
			return nil, fmt.Errorf("delete table inet %s: %w", TableName, err)
		}
		return []string{"deleted table inet " + TableName}, nil
	}
	if have == nil {
		k.create(c, want)
		if err := c.Flush(); err != nil {
			return nil, fmt.Errorf("create table inet %s: %w", TableName, err)
		}
		return []string{"created table inet " + TableName}, nil
	}

	changed, rebuild, err := k.diff(c, want)
	if err != nil {
		return nil, err
	}
	if rebuild != "" {
		// Its shape is not ours: make it again. Established connections
		// keep their translation (it is in their conntrack entry), and
		// delete and create are one transaction.
		c.DelTable(table)
		k.create(c, want)
		if err := c.Flush(); err != nil {
			return nil, fmt.Errorf("recreate table inet %s: %w", TableName, err)
		}
		return []string{"recreated table inet " + TableName + ": " + rebuild}, nil
	}
	if len(changed) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("update table inet %s: %w", TableName, err)
	}
	return changed, nil
}

// Remove deletes the table; it reports whether there was one.
func (k *Kernel) Remove() (bool, error) {
	changed, err := k.Sync(Ruleset{})
	return len(changed) > 0, err
}

// ourTable is the agent's table in the kernel, nil for none.
func ourTable(c *nftables.Conn) (*nftables.Table, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == TableName {
			return t, nil
		}
	}
	return nil, nil
}

func chainSpec() *nftables.Chain {
	return &nftables.Chain{
		Name:     ChainName,
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
		Policy:   ptr(nftables.ChainPolicyAccept),
	}
}

func ptr[T any](v T) *T { return &v }

func (f family) sets() (src, excl *nftables.Set) {
	src = &nftables.Set{Table: table, Name: f.sourceSet(), KeyType: f.keyType, Interval: true}
	excl = &nftables.Set{Table: table, Name: f.excludedSet(), KeyType: f.keyType, Interval: true}
	return
}

// create queues the whole table.
func (k *Kernel) create(c *nftables.Conn, want Ruleset) {
	c.AddTable(table)
	chain := c.AddChain(chainSpec())
	for _, f := range families {
		w := f.want(want)
		src, excl := f.sets()
		// AddSet only fails on a bad set definition, which these are not;
		// an error would surface at Flush.
		_ = c.AddSet(src, elements(w.Source, f.addrLen))
		_ = c.AddSet(excl, elements(w.Excluded, f.addrLen))
		c.AddRule(f.rule(chain, src, excl))
	}
}

// rule: meta nfproto F; saddr @pods; daddr != @nomasq; masquerade. Not
// random-fully: the pod's port is kept when free, which measured three
// times more new connections per second (docs/cells/masquerade.md).
func (f family) rule(chain *nftables.Chain, src, excl *nftables.Set) *nftables.Rule {
	return &nftables.Rule{
		Table: table,
		Chain: chain,
		Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.saddrOff, Len: f.addrLen},
			&expr.Lookup{SourceRegister: 1, SetName: src.Name, SetID: src.ID},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrO, Len: f.addrLen},
			&expr.Lookup{SourceRegister: 1, SetName: excl.Name, SetID: excl.ID, Invert: true},
			&expr.Masq{},
		},
		UserData: f.ruleTag(),
	}
}

// diff queues on c the changes that make the existing table match want.
// rebuild says why the table must be made again instead.
func (k *Kernel) diff(c *nftables.Conn, want Ruleset) (changed []string, rebuild string, err error) {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, "", fmt.Errorf("list chains: %w", err)
	}
	var chain *nftables.Chain
	for _, ch := range chains {
		if ch.Table.Name != TableName {
			continue
		}
		if ch.Name != ChainName {
			return nil, "chain " + ch.Name + " is not the agent's", nil
		}
		chain = ch
	}
	spec := chainSpec()
	if chain == nil {
		return nil, "no chain " + ChainName, nil
	}
	if chain.Type != spec.Type || chain.Hooknum == nil || *chain.Hooknum != *spec.Hooknum ||
		chain.Priority == nil || *chain.Priority != *spec.Priority || chain.Policy == nil || *chain.Policy != *spec.Policy {
		return nil, "chain " + ChainName + " has another hook, type, priority or policy", nil
	}
	sets, err := c.GetSets(table)
	if err != nil {
		return nil, "", fmt.Errorf("list sets: %w", err)
	}
	byName := map[string]*nftables.Set{}
	for _, s := range sets {
		byName[s.Name] = s
	}
	if len(byName) != 2*len(families) {
		return nil, fmt.Sprintf("%d sets, want %d", len(byName), 2*len(families)), nil
	}
	for _, f := range families {
		w := f.want(want)
		for _, x := range []struct {
			name   string
			fam    family
			want   []netip.Prefix
			source bool
		}{{f.sourceSet(), f, w.Source, true}, {f.excludedSet(), f, w.Excluded, false}} {
			s := byName[x.name]
			if s == nil || !s.Interval || s.KeyType.Name != f.keyType.Name || s.IsMap {
				return nil, "set " + x.name + " is missing or of another type", nil
			}
			have, err := c.GetSetElements(s)
			if err != nil {
				return nil, "", fmt.Errorf("list set %s: %w", x.name, err)
			}
			wantElems := elements(x.want, f.addrLen)
			if sameElements(have, wantElems) {
				continue
			}
			// Flush and refill are one transaction: no packet sees the set
			// empty.
			c.FlushSet(s)
			if err := c.SetAddElements(s, wantElems); err != nil {
				return nil, "", fmt.Errorf("set %s: %w", x.name, err)
			}
			changed = append(changed, fmt.Sprintf("set %s: %v", x.name, merge(x.want)))
		}
	}
	rules, err := c.GetRules(table, chain)
	if err != nil {
		return nil, "", fmt.Errorf("list rules: %w", err)
	}
	var tags [][]byte
	for _, r := range rules {
		tags = append(tags, r.UserData)
	}
	var wantTags [][]byte
	for _, f := range families {
		wantTags = append(wantTags, f.ruleTag())
	}
	if !slices.EqualFunc(tags, wantTags, bytes.Equal) {
		c.FlushChain(chain)
		for _, f := range families {
			src, excl := byName[f.sourceSet()], byName[f.excludedSet()]
			c.AddRule(f.rule(chain, src, excl))
		}
		changed = append(changed, "rules of chain "+ChainName)
	}
	return changed, "", nil
}

// span is an inclusive address range.
type span struct{ first, last netip.Addr }

// merge turns prefixes into sorted ranges that neither overlap nor touch:
// an interval set takes no overlapping elements.
func merge(prefixes []netip.Prefix) []span {
	spans := make([]span, 0, len(prefixes))
	for _, p := range prefixes {
		p = p.Masked()
		spans = append(spans, span{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.first.Compare(b.first) })
	var out []span
	for _, s := range spans {
		if n := len(out); n > 0 {
			prev := &out[n-1]
			if next := prev.last.Next(); !next.IsValid() || s.first.Compare(next) <= 0 {
				if s.last.Compare(prev.last) > 0 {
					prev.last = s.last
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	n := new(big.Int).SetBytes(b)
	hostBits := uint(p.Addr().BitLen() - p.Bits())
	n.Or(n, new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), hostBits), big.NewInt(1)))
	out := make([]byte, len(b))
	n.FillBytes(out)
	a, _ := netip.AddrFromSlice(out)
	return a
}

func (s span) String() string {
	if s.first == s.last {
		return s.first.String()
	}
	return s.first.String() + "-" + s.last.String()
}

// elements are an interval set's elements for prefixes: per range its
// first address, and the address after its last flagged as an interval
// end (none after the family's last address).
func elements(prefixes []netip.Prefix, addrLen uint32) []nftables.SetElement {
	var out []nftables.SetElement
	for _, s := range merge(prefixes) {
		if s.first.BitLen()/8 != int(addrLen) {
			continue
		}
		out = append(out, nftables.SetElement{Key: s.first.AsSlice()})
		if end := s.last.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// sameElements compares as sets of (key, end flag).
func sameElements(have, want []nftables.SetElement) bool {
	key := func(e nftables.SetElement) string { return fmt.Sprintf("%x/%t", e.Key, e.IntervalEnd) }
	h := make([]string, 0, len(have))
	for _, e := range have {
		h = append(h, key(e))
	}
	w := make([]string, 0, len(want))
	for _, e := range want {
		w = append(w, key(e))
	}
	slices.Sort(h)
	slices.Sort(w)
	return slices.Equal(h, w)
}
