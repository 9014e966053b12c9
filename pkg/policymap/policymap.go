// Package policymap is the layout of the network policy BPF maps
// (bpf/include/policy.h): cellium_policy, a longest-prefix-match trie
// shared by every endpoint of the node that holds the allows of the
// directions in which endpoints are isolated, and
// cellium_policy_enforcement, which says per endpoint in which directions
// it is isolated.
//
// An allow matches an endpoint, a direction, a peer identity (0: any), a
// protocol (0: any protocol and port) and a range of destination ports.
// [KeysOf] turns one into trie keys: the range becomes the fewest
// prefix-aligned blocks of ports that cover it exactly, one key each
// (80-80 is one key, 1024-65535 six, 1-65535 sixteen).
//
//	key   Key   { prefixlen u32, endpoint_id be16, direction u8, pad u8,
//	              identity be32, pad2 u8, proto u8, dport be16 }
//	value Value { prefixlen u32, cookie u32 } (the key's prefixlen; the
//	                                          allowing policies' cookie)
//
//	key   u32 endpoint ID
//	value Enforcement { flags u8 (FlagIngress|FlagEgress), pad [3]u8 }
//
// A third map, cellium_policy_prefix (see [PrefixMapName]), resolves a
// peer's address to the ID of the longest ipBlock prefix that holds it,
// which the trie's keys hold in place of an identity.
package policymap

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/bits"
	"net/netip"

	"github.com/cellium/cellium/pkg/ipcachemap"
)

// Map names, as the C declarations name them.
const (
	MapName            = "cellium_policy"
	EnforcementMapName = "cellium_policy_enforcement"
)

// EnforcementMaxEntries holds every endpoint ID, so that the enforcement map
// is never full.
const EnforcementMaxEntries = 1 << 16

// Directions of Key.Direction (TRAFFIC_* in events.h).
const (
	Ingress uint8 = 1
	Egress  uint8 = 2
)

// Prefix lengths of Key.PrefixLen (POLICY_PREFIX_* in policy.h): the bits
// up to the identity (any protocol), up to the protocol (every port), all.
const (
	PrefixIdentity = 64
	PrefixProto    = 80
	PrefixFull     = 96
)

// Flags of Enforcement.Flags: isolated in that direction.
const (
	FlagIngress uint8 = 0x01
	FlagEgress  uint8 = 0x02
)

// Key is the trie's key. The matched fields are big endian, so that a
// prefix of the bits is a prefix of the values.
type Key struct {
	PrefixLen  uint32
	EndpointID [2]byte
	Direction  uint8
	_          uint8
	Identity   [4]byte
	_          uint8
	Proto      uint8
	DPort      [2]byte
}

// Value is what the trie holds: the PrefixLen of its own key, from which
// the datapath tells the kind of match and the agent an entry of exactly a
// key from a shorter one that covers it.
type Value struct {
	PrefixLen uint32
	// Cookie names the policies that allow the entry ([Cookie]); the
	// datapath reports it in policy-verdict events.
	Cookie uint32
}

// Cookie is the cookie of a set of policy names, sorted: a hash, so that
// a restarted agent computes the same; 0 for no name.
func Cookie(policies []string) uint32 {
	if len(policies) == 0 {
		return 0
	}
	h := fnv.New32a()
	for _, p := range policies {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	if c := h.Sum32(); c != 0 {
		return c
	}
	return 1
}

// Enforcement is the enforcement map's value.
type Enforcement struct {
	Flags uint8
	_     [3]byte
}

// Allow is what one allow matches, as the policy control plane states it:
// Proto 0 is any protocol (then the ports must be 0), Port 0 every port,
// EndPort 0 Port alone.
type Allow struct {
	EndpointID uint16
	Direction  uint8
	Identity   uint32
	Proto      uint8
	Port       uint16
	EndPort    uint16
}

// Validate says what is wrong with a, naming the field.
func (a Allow) Validate() error {
	switch {
	case a.Direction != Ingress && a.Direction != Egress:
		return fmt.Errorf("direction %d: want %d (ingress) or %d (egress)", a.Direction, Ingress, Egress)
	case a.Proto == 0 && (a.Port != 0 || a.EndPort != 0):
		return fmt.Errorf("ports %d-%d without a protocol", a.Port, a.EndPort)
	case a.Port == 0 && a.EndPort != 0:
		return fmt.Errorf("end port %d without a port", a.EndPort)
	case a.EndPort != 0 && a.EndPort < a.Port:
		return fmt.Errorf("end port %d below port %d", a.EndPort, a.Port)
	}
	return nil
}

// KeysOf is the trie keys of a: one for any protocol or every port, else
// one per prefix-aligned block of the port range.
func KeysOf(a Allow) ([]Key, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	base := Key{Direction: a.Direction, Proto: a.Proto}
	binary.BigEndian.PutUint16(base.EndpointID[:], a.EndpointID)
	binary.BigEndian.PutUint32(base.Identity[:], a.Identity)
	switch {
	case a.Proto == 0:
		base.PrefixLen = PrefixIdentity
		return []Key{base}, nil
	case a.Port == 0:
		base.PrefixLen = PrefixProto
		return []Key{base}, nil
	}
	lo, hi := uint32(a.Port), uint32(a.Port)
	if a.EndPort != 0 {
		hi = uint32(a.EndPort)
	}
	var keys []Key
	for lo <= hi {
		// The largest block that starts at lo, aligned, and ends by hi.
		size := uint32(1) << bits.TrailingZeros32(lo|1<<16)
		for lo+size-1 > hi {
			size >>= 1
		}
		k := base
		k.PrefixLen = PrefixProto + 16 - uint32(bits.TrailingZeros32(size))
		binary.BigEndian.PutUint16(k.DPort[:], uint16(lo))
		keys = append(keys, k)
		lo += size
	}
	return keys, nil
}

// Endpoint is the endpoint ID of k.
func (k Key) Endpoint() uint16 { return binary.BigEndian.Uint16(k.EndpointID[:]) }

func (k Key) String() string {
	dir := "ingress"
	if k.Direction == Egress {
		dir = "egress"
	}
	id := binary.BigEndian.Uint32(k.Identity[:])
	switch {
	case k.PrefixLen <= PrefixIdentity:
		return fmt.Sprintf("ep %d %s id %d any", k.Endpoint(), dir, id)
	case k.PrefixLen == PrefixProto:
		return fmt.Sprintf("ep %d %s id %d proto %d", k.Endpoint(), dir, id, k.Proto)
	}
	port := binary.BigEndian.Uint16(k.DPort[:])
	last := uint32(port) + 1<<(PrefixFull-k.PrefixLen) - 1
	return fmt.Sprintf("ep %d %s id %d proto %d port %d-%d", k.Endpoint(), dir, id, k.Proto, port, last)
}

// PrefixMapName is the trie of the address prefixes that NetworkPolicy
// ipBlocks name, shared by every endpoint of the node: a peer's address
// resolves in it, by longest prefix match, to the prefix's ID, which the
// policy trie's entries hold in Key.Identity as they hold identities.
//
//	key   PrefixKey   (the ipcache's key: prefixlen u32, family u8, pad, addr [16]u8)
//	value PrefixValue { id u32 }
const PrefixMapName = "cellium_policy_prefix"

// PrefixMaxEntries is the C declaration's max_entries: distinct prefixes
// (ipBlock CIDRs and excepts) of all policies of the node.
const PrefixMaxEntries = 1 << 14

// PrefixKey is the prefix trie's key, laid out as the ipcache's.
type PrefixKey = ipcachemap.Key

// PrefixKeyOf is the key of p, masked.
func PrefixKeyOf(p netip.Prefix) PrefixKey { return ipcachemap.KeyOf(p) }

// PrefixValue is the prefix trie's value.
type PrefixValue struct {
	ID uint32
}

// Prefix IDs are a range of their own, above every security identity
// (pkg/identity ends at 1<<25), so that an entry of a prefix never matches
// an identity's, nor the reverse.
const (
	MinPrefixID uint32 = 1 << 30
	MaxPrefixID uint32 = 1<<31 - 1
)

// IsPrefixID says whether id is in the prefix IDs' range.
func IsPrefixID(id uint32) bool { return id >= MinPrefixID && id <= MaxPrefixID }

// PrefixID is the ID of p: a hash of the prefix into the range, so that
// a restarted agent gives a prefix the ID it had; taken says whether an
// ID is another prefix's already, and a collision takes the next free one
// (only then can the ID depend on the order prefixes came in).
func PrefixID(p netip.Prefix, taken func(uint32) bool) uint32 {
	p = p.Masked()
	h := fnv.New32a()
	b, _ := p.MarshalBinary()
	h.Write(b)
	n := MaxPrefixID - MinPrefixID + 1
	id := MinPrefixID + h.Sum32()%n
	for taken(id) {
		id = MinPrefixID + (id-MinPrefixID+1)%n
	}
	return id
}
