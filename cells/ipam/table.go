package ipam

import (
	"net/netip"
	"time"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
)

// State says why an address is allocated.
type State string

const (
	// InUse: allocated for an owner, the container of an endpoint.
	InUse State = "in-use"
	// Reserved: reserved through the API (POST /v1/ipam), kept until it is
	// released the same way.
	Reserved State = "reserved"
	// Router: the pool's router address.
	Router State = "router"
	// Unclaimed: allocated before the agent restarted for an owner that no
	// restored endpoint has claimed (yet). Released once the grace period
	// after the restore has passed.
	Unclaimed State = "unclaimed"
	// Releasing: released by its owner, held until the holder of
	// releases (the conntrack GC, see HoldReleases) has done what must
	// precede the address's next use. Not on disk: a restart frees it.
	Releasing State = "releasing"
)

// RouterOwner owns the router addresses.
const RouterOwner = "router"

// Allocation is one row of the table "ipam": an allocated address.
type Allocation struct {
	IP    netip.Addr `json:"ip" yaml:"ip"`
	Owner string     `json:"owner" yaml:"owner"`
	State State      `json:"state" yaml:"state"`
	// Since is when the address was allocated, also across restarts.
	Since time.Time `json:"since" yaml:"since"`
}

var _ statedb.TableWritable = &Allocation{}

func (a *Allocation) TableHeader() []string {
	return []string{"IP", "Owner", "State", "Since"}
}

func (a *Allocation) TableRow() []string {
	return []string{a.IP.String(), a.Owner, string(a.State), a.Since.UTC().Format(time.RFC3339)}
}

var (
	// AllocationIP indexes the ipam table by address.
	AllocationIP = statedb.Index[*Allocation, netip.Addr]{
		Name:       "ip",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.NetIPAddr(a.IP)) },
		FromKey:    index.NetIPAddr,
		FromString: index.NetIPAddrString,
		Unique:     true,
	}
	// AllocationOwner indexes the ipam table by owner.
	AllocationOwner = statedb.Index[*Allocation, string]{
		Name:       "owner",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.String(a.Owner)) },
		FromKey:    index.String,
		FromString: index.FromString,
	}
	// AllocationState indexes the ipam table by state, to find what is
	// unclaimed: `agent db show ipam --index state --key unclaimed`.
	AllocationState = statedb.Index[*Allocation, State]{
		Name:       "state",
		FromObject: func(a *Allocation) index.KeySet { return index.NewKeySet(index.String(string(a.State))) },
		FromKey:    func(s State) index.Key { return index.String(string(s)) },
		FromString: index.FromString,
	}
)

// TableName is the name of the ipam table.
const TableName = "ipam"

func newTable(db *statedb.DB) (statedb.RWTable[*Allocation], error) {
	return statedb.NewTable(db, TableName, AllocationIP, AllocationOwner, AllocationState)
}
