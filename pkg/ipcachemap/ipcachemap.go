// Package ipcachemap is the layout of the ipcache BPF map,
// cellium_ipcache (bpf/include/ipcache.h): a longest-prefix-match trie from
// an address prefix, of either family, to a security identity and the
// tunnel endpoint behind which the prefix is.
package ipcachemap

import "net/netip"

// MapName is the map's pin name, as the C declaration names it.
const MapName = "cellium_ipcache"

// MaxEntries is the C declaration's max_entries.
const MaxEntries = 1 << 19

// Address families of Key.Family and Value.TunnelFamily.
const (
	FamilyIPv4 = 4
	FamilyIPv6 = 6
)

// prefixHdrBits is the part of Key.PrefixLen that covers Family and its
// padding: the trie matches them before the address.
const prefixHdrBits = 32

// FlagLocalEndpoint in Value.Flags: the prefix is a local endpoint's address.
const FlagLocalEndpoint = 0x01

// Key is the trie's key: a prefix.
type Key struct {
	PrefixLen uint32
	Family    uint8
	_         [3]byte
	// Addr holds an IPv4 address in its first four bytes.
	Addr [16]byte
}

// Value is what the trie holds for a prefix.
type Value struct {
	Identity uint32
	// TunnelEndpoint is the node behind which the prefix is, when
	// TunnelFamily is not 0; an IPv4 address in its first four bytes.
	TunnelEndpoint [16]byte
	TunnelFamily   uint8
	Flags          uint8
	_              [2]byte
}

// KeyOf is the key of p, masked.
func KeyOf(p netip.Prefix) Key {
	p = p.Masked()
	k := Key{PrefixLen: prefixHdrBits + uint32(p.Bits())}
	if p.Addr().Is4() {
		a := p.Addr().As4()
		copy(k.Addr[:], a[:])
		k.Family = FamilyIPv4
	} else {
		k.Addr = p.Addr().As16()
		k.Family = FamilyIPv6
	}
	return k
}

// Prefix is the prefix of the key; not valid for a malformed key.
func (k Key) Prefix() netip.Prefix {
	bits := int(k.PrefixLen) - prefixHdrBits
	switch k.Family {
	case FamilyIPv4:
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(k.Addr[:4])), bits)
	case FamilyIPv6:
		return netip.PrefixFrom(netip.AddrFrom16(k.Addr), bits)
	}
	return netip.Prefix{}
}

// SetTunnelEndpoint sets the tunnel endpoint; an invalid addr clears it.
func (v *Value) SetTunnelEndpoint(addr netip.Addr) {
	v.TunnelEndpoint, v.TunnelFamily = [16]byte{}, 0
	switch {
	case addr.Is4():
		a := addr.As4()
		copy(v.TunnelEndpoint[:], a[:])
		v.TunnelFamily = FamilyIPv4
	case addr.IsValid():
		v.TunnelEndpoint = addr.As16()
		v.TunnelFamily = FamilyIPv6
	}
}

// TunnelAddr is the tunnel endpoint, invalid when there is none.
func (v Value) TunnelAddr() netip.Addr {
	switch v.TunnelFamily {
	case FamilyIPv4:
		return netip.AddrFrom4([4]byte(v.TunnelEndpoint[:4]))
	case FamilyIPv6:
		return netip.AddrFrom16(v.TunnelEndpoint)
	}
	return netip.Addr{}
}
