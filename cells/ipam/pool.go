package ipam

import (
	"fmt"
	"math"
	"net/netip"
)

// Family is an address family.
type Family string

const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// FamilyOf is the family of addr.
func FamilyOf(addr netip.Addr) Family {
	if addr.Is4() {
		return IPv4
	}
	return IPv6
}

// Pool is the range of one family that pods get their addresses from.
//
// Its first address is the network address, never handed out. The next one
// is the router address, which the host side of every endpoint answers for
// and the pods' default route goes through. Pods get the rest, except the
// IPv4 broadcast address.
type Pool struct {
	Family Family
	CIDR   netip.Prefix
	Router netip.Addr
}

// ParsePool validates a pod CIDR and returns its pool. what names the
// input in errors, e.g. "--pod-cidr".
func ParsePool(what, cidr string) (Pool, error) {
	prefix, err := netip.ParsePrefix(cidr)
	if err != nil {
		return Pool{}, fmt.Errorf("invalid %s %q: want a CIDR such as 10.244.0.0/24 or fd00:10:244::/112", what, cidr)
	}
	if prefix.Addr().Zone() != "" || prefix.Addr().Is4In6() {
		return Pool{}, fmt.Errorf("invalid %s %q: want a plain IPv4 or IPv6 CIDR", what, cidr)
	}
	if prefix != prefix.Masked() {
		return Pool{}, fmt.Errorf("invalid %s %q: host bits are set; the network is %s", what, cidr, prefix.Masked())
	}
	// At least the router and one pod.
	maxBits := 30
	if prefix.Addr().Is6() {
		maxBits = 126
	}
	if prefix.Bits() > maxBits {
		return Pool{}, fmt.Errorf("invalid %s %q: too small for a router and a pod; the longest prefix is /%d", what, cidr, maxBits)
	}
	return Pool{Family: FamilyOf(prefix.Addr()), CIDR: prefix, Router: prefix.Addr().Next()}, nil
}

// first is the first address of the pool that can be allocated: the router.
func (p Pool) first() netip.Addr { return p.Router }

// last is the last address that can be allocated.
func (p Pool) last() netip.Addr {
	a := p.CIDR.Addr().AsSlice()
	for i := p.CIDR.Bits(); i < len(a)*8; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	last, _ := netip.AddrFromSlice(a)
	if p.Family == IPv4 {
		return last.Prev() // the broadcast address
	}
	return last
}

// Contains says whether addr may be allocated from the pool.
func (p Pool) Contains(addr netip.Addr) bool {
	return p.CIDR.Contains(addr) && !addr.Less(p.first()) && !p.last().Less(addr)
}

// Size is the number of addresses that can be allocated, router included,
// capped at MaxUint64 for the largest IPv6 pools.
func (p Pool) Size() uint64 {
	hostBits := p.CIDR.Addr().BitLen() - p.CIDR.Bits()
	if hostBits >= 64 {
		return math.MaxUint64
	}
	n := uint64(1)<<hostBits - 1 // less the network address
	if p.Family == IPv4 {
		n-- // and the broadcast address
	}
	return n
}
