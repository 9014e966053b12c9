package apiv1

import "time"

// PathIPAM serves the pod address pools and their allocations.
const PathIPAM = "/v1/ipam"

// Address families, as IPAM pools and requests name them.
const (
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

// IPAM allocation states.
const (
	// AllocationInUse: allocated for an owner (an endpoint's container).
	AllocationInUse = "in-use"
	// AllocationReserved: reserved through POST /v1/ipam; kept until
	// released through DELETE /v1/ipam/{ip}.
	AllocationReserved = "reserved"
	// AllocationRouter: the pool's router address, which the host side of
	// every endpoint answers for.
	AllocationRouter = "router"
	// AllocationUnclaimed: allocated before the agent restarted for an
	// owner that did not become an endpoint; released once the grace
	// period (--ipam-leak-grace) after the restore has passed.
	AllocationUnclaimed = "unclaimed"
	// AllocationReleasing: released by its owner, handed to no one until
	// the conntrack garbage collector has deleted the entries with it.
	AllocationReleasing = "releasing"
)

// IPAM is the answer of GET /v1/ipam.
type IPAM struct {
	// Mode is the IPAM mode, static or kubernetes.
	Mode  string     `json:"mode"`
	Pools []IPAMPool `json:"pools"`
	// Ready is false while the pools are not known yet or a restore is
	// still reserving its addresses; Pending names what it waits for.
	Ready       bool             `json:"ready"`
	Pending     []string         `json:"pending,omitempty"`
	Allocations []IPAMAllocation `json:"allocations"`
}

// IPAMPool is the address range of one family that pods get addresses from.
type IPAMPool struct {
	Family string `json:"family"`
	CIDR   string `json:"cidr"`
	Router string `json:"router"`
	// Size is the number of addresses pods can get, router included.
	Size uint64 `json:"size"`
	// Used is the number of them that are allocated.
	Used uint64 `json:"used"`
}

// IPAMAllocation is one allocated address.
type IPAMAllocation struct {
	IP    string    `json:"ip"`
	Owner string    `json:"owner"`
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

// IPAMReserve is the body of POST /v1/ipam: reserve IP, or the next free
// address of Family, for Owner. The answer is the IPAMAllocation.
type IPAMReserve struct {
	Owner  string `json:"owner"`
	Family string `json:"family,omitempty"`
	IP     string `json:"ip,omitempty"`
}
