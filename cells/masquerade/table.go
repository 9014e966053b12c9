package masquerade

import (
	"net/netip"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/internal/tables"
)

// Role is what a prefix of the table "masquerade" is to the rules.
type Role string

const (
	// RoleSource: traffic from the prefix (this node's pods) is
	// masqueraded when it goes elsewhere than to an excluded prefix.
	RoleSource Role = "source"
	// RoleExcluded: traffic to the prefix (the cluster's pods and nodes,
	// --native-routing-cidr) keeps its source address.
	RoleExcluded Role = "excluded"
)

// Prefix is one row of the table "masquerade". Rows are immutable.
type Prefix struct {
	Role   Role         `json:"role"`
	Prefix netip.Prefix `json:"prefix"`
	// Reasons say where the prefix comes from: "pod CIDR of node-2",
	// "address of node-2", "--native-routing-cidr".
	Reasons []string          `json:"reasons"`
	Status  reconciler.Status `json:"status"`
}

// PrefixTable is the name of the table of masquerade prefixes.
const PrefixTable = "masquerade"

var _ statedb.TableWritable = &Prefix{}

func (p *Prefix) TableHeader() []string { return []string{"Role", "Prefix", "Reasons", "Status"} }
func (p *Prefix) TableRow() []string {
	return []string{string(p.Role), p.Prefix.String(), strings.Join(p.Reasons, "; "), p.Status.String()}
}

func (p *Prefix) Clone() *Prefix            { c := *p; return &c }
func (p *Prefix) status() reconciler.Status { return p.Status }

// ByRolePrefix indexes the rows by role and prefix, as "source/10.244.1.0/24".
var ByRolePrefix = statedb.Index[*Prefix, string]{
	Name: "role-prefix",
	FromObject: func(p *Prefix) index.KeySet {
		return index.NewKeySet(index.String(string(p.Role) + "/" + p.Prefix.String()))
	},
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

func newTable(db *statedb.DB) (statedb.RWTable[*Prefix], error) {
	return statedb.NewTable(db, PrefixTable, ByRolePrefix, tables.StatusIndex((*Prefix).status))
}
