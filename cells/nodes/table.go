package nodes

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// Source is where a node's description comes from. When several describe
// one node, the greatest wins.
type Source uint8

const (
	// SourceKVStore: the node's nodes/v1/<name> key, published by its agent.
	SourceKVStore Source = iota
	// SourceK8s: the Node object.
	SourceK8s
	// SourceLocal: this agent, of its own node.
	SourceLocal
)

var sourceNames = []string{"kvstore", "k8s", "local"}

func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "source-" + strconv.Itoa(int(s))
}

func (s Source) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// AddressType is the kind of a node address, as in a Node's status.
type AddressType string

const (
	InternalIP AddressType = "InternalIP"
	ExternalIP AddressType = "ExternalIP"
)

// Address is one address of a node.
type Address struct {
	Type AddressType `json:"type"`
	IP   netip.Addr  `json:"ip"`
}

// Spec is what one source says of a node. It is also the value of a
// nodes/v1/<name> key (with the name).
type Spec struct {
	Addresses []Address      `json:"addresses"`
	PodCIDRs  []netip.Prefix `json:"podCIDRs,omitempty"`
	// HealthIPs are the addresses of the node's health endpoint.
	HealthIPs []netip.Addr `json:"healthIPs,omitempty"`
}

func (s Spec) equal(o Spec) bool {
	return slices.Equal(s.Addresses, o.Addresses) && slices.Equal(s.PodCIDRs, o.PodCIDRs) && slices.Equal(s.HealthIPs, o.HealthIPs)
}

// Node is one row of the table "nodes": a node of the cluster, as its
// strongest source describes it, with what of that description is unusable
// taken out and said in Problems. Rows are immutable.
type Node struct {
	Name string `json:"name"`
	// Local is this agent's node.
	Local  bool   `json:"local"`
	Source Source `json:"source"`
	Spec
	// Problems say what of the source's description is ignored, and why: a
	// node without address, a pod CIDR that overlaps another node's.
	Problems []string `json:"problems,omitempty"`
}

var _ statedb.TableWritable = &Node{}

// IP is the address other nodes reach the node at, of the family of
// want (IPv4 for an invalid want): the first InternalIP, else the first
// ExternalIP; invalid when it has none.
func (n *Node) IP(want netip.Addr) netip.Addr {
	is4 := !want.IsValid() || want.Is4()
	for _, typ := range []AddressType{InternalIP, ExternalIP} {
		for _, a := range n.Addresses {
			if a.Type == typ && a.IP.Is4() == is4 {
				return a.IP
			}
		}
	}
	return netip.Addr{}
}

// PrimaryIP is the node's IPv4 address, else its IPv6 one.
func (n *Node) PrimaryIP() netip.Addr {
	if ip := n.IP(netip.IPv4Unspecified()); ip.IsValid() {
		return ip
	}
	return n.IP(netip.IPv6Unspecified())
}

func (n *Node) TableHeader() []string {
	return []string{"Name", "Local", "Source", "Addresses", "PodCIDRs", "HealthIPs", "Problems"}
}

func (n *Node) TableRow() []string {
	addrs := make([]string, len(n.Addresses))
	for i, a := range n.Addresses {
		addrs[i] = fmt.Sprintf("%s (%s)", a.IP, a.Type)
	}
	return []string{n.Name, strconv.FormatBool(n.Local), n.Source.String(), strings.Join(addrs, ", "),
		joinStrings(n.PodCIDRs), joinStrings(n.HealthIPs), strings.Join(n.Problems, "; ")}
}

func joinStrings[T fmt.Stringer](xs []T) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return strings.Join(out, ",")
}

func (n *Node) equal(o *Node) bool {
	return n.Name == o.Name && n.Local == o.Local && n.Source == o.Source && n.Spec.equal(o.Spec) && slices.Equal(n.Problems, o.Problems)
}

var (
	// ByName indexes nodes by name.
	ByName = statedb.Index[*Node, string]{
		Name:       "name",
		FromObject: func(n *Node) index.KeySet { return index.NewKeySet(index.String(n.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// ByLocal indexes nodes by whether they are this agent's.
	ByLocal = statedb.Index[*Node, bool]{
		Name:       "local",
		FromObject: func(n *Node) index.KeySet { return index.NewKeySet(index.Bool(n.Local)) },
		FromKey:    index.Bool,
		FromString: index.BoolString,
	}
)

// TableName is the name of the nodes table.
const TableName = "nodes"

// NewTable registers the nodes table: the cell provides it; tests of its
// readers may provide it alone.
func NewTable(db *statedb.DB) (statedb.RWTable[*Node], error) {
	return statedb.NewTable(db, TableName, ByName, ByLocal)
}

// LocalNode is this agent's node, once known.
func LocalNode(txn statedb.ReadTxn, tbl statedb.Table[*Node]) (*Node, bool) {
	n, _, found := tbl.Get(txn, ByLocal.Query(true))
	return n, found
}
