// Package identity is the numbering of security identities: the reserved
// identities every node knows, the range the cluster allocates through the
// kvstore, and the node-local range.
//
// An identity stands for a set of labels (package labels): every endpoint
// with the same label set has the same identity, on every node when a
// kvstore is configured. The datapath carries identities, not labels: the
// ipcache maps an address to one, and trace and drop events report the
// source's and the destination's.
package identity

import (
	"fmt"
	"strconv"
)

// NumericIdentity is a security identity's number.
type NumericIdentity uint32

// The reserved identities. Their numbers are fixed, across the cluster and
// across versions: the datapath and flows carry them.
const (
	// Unknown: no identity is known (never allocated).
	Unknown NumericIdentity = 0
	// Host: this node's own addresses.
	Host NumericIdentity = 1
	// World: anything outside the cluster (0.0.0.0/0, ::/0).
	World NumericIdentity = 2
	// Unmanaged: an endpoint no agent manages.
	Unmanaged NumericIdentity = 3
	// Health: a node's health endpoint.
	Health NumericIdentity = 4
	// Init: an endpoint whose labels are not resolved to an identity yet.
	Init NumericIdentity = 5
	// RemoteNode: another node's addresses.
	RemoteNode NumericIdentity = 6
	// KubeAPIServer: the Kubernetes API server.
	KubeAPIServer NumericIdentity = 7
)

// The allocated ranges.
const (
	// MinCluster and MaxCluster bound the identities allocated cluster-wide
	// through the kvstore.
	MinCluster NumericIdentity = 256
	MaxCluster NumericIdentity = 65535
	// MinLocal is the first node-local identity (CIDR identities, and every
	// identity when no kvstore is configured); the range ends at MaxLocal.
	MinLocal NumericIdentity = 1 << 24
	MaxLocal NumericIdentity = 1<<25 - 1
)

var reservedNames = map[NumericIdentity]string{
	Host:          "host",
	World:         "world",
	Unmanaged:     "unmanaged",
	Health:        "health",
	Init:          "init",
	RemoteNode:    "remote-node",
	KubeAPIServer: "kube-apiserver",
}

// Reserved is every reserved identity and its name ("host", "world", ...).
func Reserved() map[NumericIdentity]string {
	m := make(map[NumericIdentity]string, len(reservedNames))
	for id, name := range reservedNames {
		m[id] = name
	}
	return m
}

// IsReserved says whether id is one of the reserved identities.
func (id NumericIdentity) IsReserved() bool { _, ok := reservedNames[id]; return ok }

// IsCluster says whether id is in the cluster-wide range.
func (id NumericIdentity) IsCluster() bool { return id >= MinCluster && id <= MaxCluster }

// IsLocal says whether id is in the node-local range.
func (id NumericIdentity) IsLocal() bool { return id >= MinLocal && id <= MaxLocal }

// ReservedName is the name of a reserved identity, "" for any other.
func (id NumericIdentity) ReservedName() string { return reservedNames[id] }

func (id NumericIdentity) String() string { return strconv.FormatUint(uint64(id), 10) }

// Parse reads an identity number, or the name of a reserved identity.
func Parse(s string) (NumericIdentity, error) {
	for id, name := range reservedNames {
		if s == name || s == "reserved:"+name {
			return id, nil
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("identity %q: want a number or a reserved name (host, world, ...)", s)
	}
	return NumericIdentity(n), nil
}
