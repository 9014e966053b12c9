package k8sendpoints

import (
	"net/netip"
	"strings"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/k8sapi"
)

// Endpoint is one row of the table "k8s-endpoints": a pod of another
// node, from its CelliumEndpoint object, checked. Rows are immutable.
type Endpoint struct {
	Namespace  string                   `json:"namespace"`
	Name       string                   `json:"name"`
	Node       string                   `json:"node"`
	NodeIP     netip.Addr               `json:"nodeIP,omitzero"`
	Identity   identity.NumericIdentity `json:"identity"`
	Addresses  []netip.Addr             `json:"addresses"`
	NamedPorts []k8sapi.NamedPort       `json:"namedPorts,omitempty"`
	// Created is the object's creation: of two objects claiming one
	// address, the newer wins.
	Created time.Time `json:"created"`
}

// Key is namespace/name.
func (e *Endpoint) Key() string { return e.Namespace + "/" + e.Name }

var _ statedb.TableWritable = &Endpoint{}

func (e *Endpoint) TableHeader() []string {
	return []string{"Name", "Node", "NodeIP", "Identity", "Addresses"}
}

func (e *Endpoint) TableRow() []string {
	addrs := make([]string, len(e.Addresses))
	for i, a := range e.Addresses {
		addrs[i] = a.String()
	}
	nodeIP := ""
	if e.NodeIP.IsValid() {
		nodeIP = e.NodeIP.String()
	}
	return []string{e.Key(), e.Node, nodeIP, e.Identity.String(), strings.Join(addrs, " ")}
}

var (
	// ByName indexes the endpoints by namespace/name.
	ByName = statedb.Index[*Endpoint, string]{
		Name:       "name",
		FromObject: func(e *Endpoint) index.KeySet { return index.NewKeySet(index.String(e.Key())) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// ByAddress indexes them by each address.
	ByAddress = statedb.Index[*Endpoint, netip.Addr]{
		Name: "address",
		FromObject: func(e *Endpoint) index.KeySet {
			if len(e.Addresses) == 0 {
				return index.KeySet{}
			}
			keys := make([]index.Key, len(e.Addresses))
			for i, a := range e.Addresses {
				keys[i] = index.NetIPAddr(a)
			}
			return index.NewKeySet(keys[0], keys[1:]...)
		},
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
	}
)

// TableName is the name of the table of other nodes' endpoints.
const TableName = "k8s-endpoints"

func newTable(db *statedb.DB) (statedb.RWTable[*Endpoint], error) {
	return statedb.NewTable(db, TableName, ByName, ByAddress)
}
