package policy

import (
	"fmt"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/policymap"
)

// Direction is the way traffic goes relative to the endpoint.
type Direction uint8

const (
	Ingress Direction = iota
	Egress
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// EntryKey is what one desired policy map entry matches, for one endpoint
// of this node: traffic in Direction with a peer of Identity (identity.Unknown
// = any peer), of Protocol (IP protocol number, 0 = any protocol and port),
// to a destination port in [Port, EndPort] (Port 0 = every port of the
// protocol; EndPort 0 = Port alone). Ports are the destination's: for
// ingress the endpoint's own, for egress the peer's (after service
// translation).
type EntryKey struct {
	EndpointID uint16
	Direction  Direction
	Identity   identity.NumericIdentity
	Protocol   uint8
	Port       uint16
	EndPort    uint16
}

func (k EntryKey) String() string {
	return fmt.Sprintf("ep %d %s id %d proto %d port %d-%d", k.EndpointID, k.Direction, k.Identity, k.Protocol, k.Port, k.EndPort)
}

// Entry is one row of the table "policy-entries": an allow the endpoint's
// policy map must hold. An endpoint isolated in a direction has exactly
// its allows in the map; one not isolated has no entries for it and the
// datapath allows everything (see Enforcement).
type Entry struct {
	Key EntryKey
	// Policies names the NetworkPolicies ("namespace/name") that allow
	// this traffic, for Hubble's allowed_by and `agent policy trace`.
	Policies []string
	Status   reconciler.Status
}

func (e *Entry) TableHeader() []string {
	return []string{"Endpoint", "Direction", "Identity", "Protocol", "Ports", "Policies", "Status"}
}

func (e *Entry) TableRow() []string {
	return []string{
		fmt.Sprint(e.Key.EndpointID), e.Key.Direction.String(), fmt.Sprint(e.Key.Identity),
		fmt.Sprint(e.Key.Protocol), fmt.Sprintf("%d-%d", e.Key.Port, e.Key.EndPort),
		fmt.Sprint(e.Policies), e.Status.String(),
	}
}

// Clone returns a shallow copy for the reconciler to set the status on.
func (e *Entry) Clone() *Entry { c := *e; return &c }

// Enforcement is one row of the table "policy-enforcement": whether an
// endpoint is isolated in each direction (some policy with that policy type
// selects it). The datapath consults the entries only in an isolated
// direction; Revision is the policy revision this row was computed from.
type Enforcement struct {
	EndpointID uint16
	Ingress    bool
	Egress     bool
	Revision   uint64
	Status     reconciler.Status
}

func (e *Enforcement) TableHeader() []string {
	return []string{"Endpoint", "Ingress", "Egress", "Revision", "Status"}
}

func (e *Enforcement) TableRow() []string {
	return []string{fmt.Sprint(e.EndpointID), fmt.Sprint(e.Ingress), fmt.Sprint(e.Egress), fmt.Sprint(e.Revision), e.Status.String()}
}

func (e *Enforcement) Clone() *Enforcement { c := *e; return &c }

func entryKeyBytes(k EntryKey) index.Key {
	return index.Key(fmt.Appendf(nil, "%05d/%d/%010d/%03d/%05d/%05d", k.EndpointID, k.Direction, k.Identity, k.Protocol, k.Port, k.EndPort))
}

// EndpointIdentity is an endpoint of this node and a peer identity.
type EndpointIdentity struct {
	EndpointID uint16
	Identity   identity.NumericIdentity
}

func endpointIdentityKey(k EndpointIdentity) index.Key {
	return append(index.Uint16(k.EndpointID), index.Uint32(uint32(k.Identity))...)
}

var (
	// EntryByKey is the primary index of "policy-entries".
	EntryByKey = statedb.Index[*Entry, EntryKey]{
		Name:       "key",
		FromObject: func(e *Entry) index.KeySet { return index.NewKeySet(entryKeyBytes(e.Key)) },
		FromKey:    entryKeyBytes,
		FromString: func(s string) (index.Key, error) { return index.Key(s), nil },
		Unique:     true,
	}
	// EntryByEndpoint finds an endpoint's entries.
	EntryByEndpoint = statedb.Index[*Entry, uint16]{
		Name:       "endpoint",
		FromObject: func(e *Entry) index.KeySet { return index.NewKeySet(index.Uint16(e.Key.EndpointID)) },
		FromKey:    index.Uint16,
		FromString: index.Uint16String,
		Unique:     false,
	}
	// EntryByEndpointIdentity finds an endpoint's entries for one peer
	// identity: what a new or vanished identity changes.
	EntryByEndpointIdentity = statedb.Index[*Entry, EndpointIdentity]{
		Name: "endpoint-identity",
		FromObject: func(e *Entry) index.KeySet {
			return index.NewKeySet(endpointIdentityKey(EndpointIdentity{e.Key.EndpointID, e.Key.Identity}))
		},
		FromKey: endpointIdentityKey,
		FromString: func(s string) (index.Key, error) {
			var k EndpointIdentity
			if _, err := fmt.Sscanf(s, "%d/%d", &k.EndpointID, &k.Identity); err != nil {
				return nil, fmt.Errorf("want ENDPOINT/IDENTITY: %w", err)
			}
			return endpointIdentityKey(k), nil
		},
		Unique: false,
	}
	// EntryByCookie finds the entries of a cookie (pkg/policymap.Cookie
	// of their Policies): what a policy-verdict event's cookie names.
	EntryByCookie = statedb.Index[*Entry, uint32]{
		Name:       "cookie",
		FromObject: func(e *Entry) index.KeySet { return index.NewKeySet(index.Uint32(policymap.Cookie(e.Policies))) },
		FromKey:    index.Uint32,
		FromString: index.Uint32String,
		Unique:     false,
	}
	// EnforcementByEndpoint is the primary index of "policy-enforcement".
	EnforcementByEndpoint = statedb.Index[*Enforcement, uint16]{
		Name:       "endpoint",
		FromObject: func(e *Enforcement) index.KeySet { return index.NewKeySet(index.Uint16(e.EndpointID)) },
		FromKey:    index.Uint16,
		FromString: index.Uint16String,
		Unique:     true,
	}
)

// NewEntriesTable and NewEnforcementTable make the two tables the policy
// cell writes and the policy-maps reconciler reads.
func NewEntriesTable(db *statedb.DB) (statedb.RWTable[*Entry], error) {
	return statedb.NewTable(db, "policy-entries", EntryByKey, EntryByEndpoint, EntryByEndpointIdentity, EntryByCookie)
}

// AllowedBy are the policies a policy-verdict event's cookie names (those
// of an entry with that cookie), nil for a cookie no entry has.
func AllowedBy(txn statedb.ReadTxn, entries statedb.Table[*Entry], cookie uint32) []string {
	if cookie == 0 {
		return nil
	}
	for e := range entries.List(txn, EntryByCookie.Query(cookie)) {
		return e.Policies
	}
	return nil
}

func NewEnforcementTable(db *statedb.DB) (statedb.RWTable[*Enforcement], error) {
	return statedb.NewTable(db, "policy-enforcement", EnforcementByEndpoint)
}

// Allows says whether the entry allows traffic with peer to a destination
// port of proto: the lookup the datapath makes of an isolated direction.
func (k EntryKey) Allows(peer identity.NumericIdentity, proto uint8, port uint16) bool {
	if k.Identity != identity.Unknown && k.Identity != peer {
		return false
	}
	if k.Protocol == 0 {
		return true
	}
	if k.Protocol != proto {
		return false
	}
	switch {
	case k.Port == 0:
		return true
	case k.EndPort == 0:
		return port == k.Port
	}
	return port >= k.Port && port <= k.EndPort
}
