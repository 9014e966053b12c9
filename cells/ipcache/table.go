package ipcache

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/pkg/identity"
)

// Source is where a claim on a prefix comes from. When several sources
// claim one prefix, the greatest wins.
type Source uint8

const (
	// SourceRestored: read back from the pinned map at start; kept until
	// every other source has synced.
	SourceRestored Source = iota
	// SourceNode: another node's addresses and pod CIDRs, from the nodes
	// table.
	SourceNode
	// SourceK8s: from Kubernetes objects.
	SourceK8s
	// SourceKVStore: from another node, through the kvstore (ip/v1).
	SourceKVStore
	// SourceReserved: the node's own addresses (host) and the world.
	SourceReserved
	// SourceLocal: an endpoint of this node.
	SourceLocal
)

var sourceNames = []string{"restored", "node", "k8s", "kvstore", "reserved", "local"}

func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "source-" + strconv.Itoa(int(s))
}

func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Claim is what one source says of a prefix.
type Claim struct {
	Source   Source                   `json:"source"`
	Identity identity.NumericIdentity `json:"identity"`
	// HostIP is the node behind which the prefix is (the tunnel endpoint),
	// invalid for none.
	HostIP    netip.Addr `json:"hostIP,omitzero"`
	Namespace string     `json:"namespace,omitempty"`
	PodName   string     `json:"podName,omitempty"`
	// Flags are the map value's flags (ipcachemap.Flag*).
	Flags uint8 `json:"flags,omitempty"`
}

// Entry is one row of the table "ipcache": a prefix and every source's
// claim on it, the strongest first. The map gets the strongest. Rows are
// immutable.
type Entry struct {
	Prefix netip.Prefix      `json:"prefix"`
	Claims []Claim           `json:"claims"`
	Status reconciler.Status `json:"status"`
}

var _ statedb.TableWritable = &Entry{}

// Winner is the claim the map holds.
func (e *Entry) Winner() Claim { return e.Claims[0] }

func (e *Entry) Clone() *Entry {
	c := *e
	return &c
}

func (e *Entry) TableHeader() []string {
	return []string{"Prefix", "Identity", "Source", "HostIP", "Pod", "Other sources", "Status"}
}

func (e *Entry) TableRow() []string {
	w := e.Winner()
	host, pod := "", ""
	if w.HostIP.IsValid() {
		host = w.HostIP.String()
	}
	if w.PodName != "" {
		pod = w.Namespace + "/" + w.PodName
	}
	others := ""
	for _, c := range e.Claims[1:] {
		others += fmt.Sprintf("%s:%d ", c.Source, c.Identity)
	}
	return []string{e.Prefix.String(), w.Identity.String(), w.Source.String(), host, pod, others, e.Status.String()}
}

// withClaim is a copy of e with c replacing the claim of its source;
// changed is false when c was already there.
func (e *Entry) withClaim(c Claim) (out *Entry, changed bool) {
	claims := slices.Clone(e.Claims)
	i := slices.IndexFunc(claims, func(o Claim) bool { return o.Source == c.Source })
	if i >= 0 {
		if claims[i] == c {
			return e, false
		}
		claims[i] = c
	} else {
		claims = append(claims, c)
	}
	slices.SortFunc(claims, func(a, b Claim) int { return int(b.Source) - int(a.Source) })
	return &Entry{Prefix: e.Prefix, Claims: claims}, true
}

// withoutClaim is a copy of e without source's claim (nil when none is
// left); changed is false when source had none.
func (e *Entry) withoutClaim(source Source) (out *Entry, changed bool) {
	i := slices.IndexFunc(e.Claims, func(o Claim) bool { return o.Source == source })
	if i < 0 {
		return e, false
	}
	claims := slices.Delete(slices.Clone(e.Claims), i, i+1)
	if len(claims) == 0 {
		return nil, true
	}
	return &Entry{Prefix: e.Prefix, Claims: claims}, true
}

var (
	// ByPrefix indexes the ipcache by prefix.
	ByPrefix = statedb.Index[*Entry, netip.Prefix]{
		Name:       "prefix",
		FromObject: func(e *Entry) index.KeySet { return index.NewKeySet(index.NetIPPrefix(e.Prefix)) },
		FromKey:    index.NetIPPrefix,
		FromString: index.NetIPPrefixString,
		Unique:     true,
	}
)

// TableName is the name of the ipcache table.
const TableName = "ipcache"

// NewTable registers the ipcache table: the cell provides it; tests of its
// readers may provide it alone.
func NewTable(db *statedb.DB) (statedb.RWTable[*Entry], error) {
	return statedb.NewTable(db, TableName, ByPrefix)
}

// Lookup is the entry of the longest prefix that holds addr.
func Lookup(txn statedb.ReadTxn, tbl statedb.Table[*Entry], addr netip.Addr) (*Entry, bool) {
	addr = addr.Unmap()
	for bits := addr.BitLen(); bits >= 0; bits-- {
		p, _ := addr.Prefix(bits)
		if e, _, found := tbl.Get(txn, ByPrefix.Query(p)); found {
			return e, true
		}
	}
	return nil, false
}
