package identity

import (
	"strconv"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// Kind says where an identity comes from.
type Kind string

const (
	// KindReserved: one of the fixed identities (host, world, ...).
	KindReserved Kind = "reserved"
	// KindCluster: allocated cluster-wide, through the kvstore or the
	// Kubernetes API.
	KindCluster Kind = "cluster"
	// KindLocal: allocated by this node alone.
	KindLocal Kind = "local"
)

// Source says where a row comes from.
type Source string

const (
	SourceReserved Source = "reserved"
	// SourceLocal: this node's allocator (and its checkpoint).
	SourceLocal Source = "local"
	// SourceKVStore: a master key in the kvstore.
	SourceKVStore Source = "kvstore"
	// SourceCRD: a CelliumIdentity object in the Kubernetes API.
	SourceCRD Source = "crd"
)

// kind is the kind of identities from s.
func (s Source) kind() Kind {
	switch s {
	case SourceReserved:
		return KindReserved
	case SourceLocal:
		return KindLocal
	}
	return KindCluster
}

// Identity is one row of the table "identities": a security identity and
// the label set it stands for. Rows are immutable.
type Identity struct {
	ID     identity.NumericIdentity `json:"id"`
	Labels labels.Labels            `json:"labels"`
	Kind   Kind                     `json:"kind"`
	Source Source                   `json:"source"`
	// Refs is how many endpoints of this node use the identity.
	Refs int `json:"refs"`
}

var _ statedb.TableWritable = &Identity{}

func (i *Identity) TableHeader() []string { return []string{"ID", "Kind", "Source", "Refs", "Labels"} }

func (i *Identity) TableRow() []string {
	return []string{i.ID.String(), string(i.Kind), string(i.Source), strconv.Itoa(i.Refs), strings.Join(i.Labels.Strings(), " ")}
}

var (
	// ByID indexes identities by number.
	ByID = statedb.Index[*Identity, identity.NumericIdentity]{
		Name:       "id",
		FromObject: func(i *Identity) index.KeySet { return index.NewKeySet(index.Uint32(uint32(i.ID))) },
		FromKey:    func(id identity.NumericIdentity) index.Key { return index.Uint32(uint32(id)) },
		FromString: index.Uint32String,
		Unique:     true,
	}
	// ByLabels indexes identities by their label set's canonical string.
	// Not unique: for a while two cluster numbers may name one set (see
	// Allocator.allocateCluster); queries list them lowest first.
	ByLabels = statedb.Index[*Identity, string]{
		Name:       "labels",
		FromObject: func(i *Identity) index.KeySet { return index.NewKeySet(index.String(i.Labels.String())) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
)

// TableName is the name of the identities table.
const TableName = "identities"

// NewTable registers the identities table: the cell provides it; tests of
// its readers may provide it alone.
func NewTable(db *statedb.DB) (statedb.RWTable[*Identity], error) {
	return statedb.NewTable(db, TableName, ByID, ByLabels)
}

// reservedRows are the rows of the reserved identities, labelled
// reserved:<name>.
func reservedRows() []*Identity {
	var rows []*Identity
	for id, name := range identity.Reserved() {
		rows = append(rows, &Identity{ID: id, Kind: KindReserved, Source: SourceReserved,
			Labels: labels.New(labels.Label{Source: labels.SourceReserved, Key: name})})
	}
	return rows
}
