package maglev

import (
	"math/bits"
	"net/netip"
)

// flowHashSeed is the seed of FlowHash4, the same in the datapath
// (bpf/include/lb_select.h, FLOW_HASH_SEED): part of the contract between
// nodes, like the table seeds.
const flowHashSeed = 0x63656c6c // "cell"

// FlowHash4 is the hash from which the NodePort programs take a
// connection's slot in a Maglev table (hash % table size): MurmurHash3's
// 32-bit block mixing and finalizer over four words, the source address,
// the destination address, the source port in the upper and the
// destination port in the lower half, and the protocol, all in host
// order. Its seed is fixed, so every node picks the same backend for the
// same connection; the kernel's own packet hash is seeded at boot.
func FlowHash4(src, dst netip.AddrPort, proto uint8) uint32 {
	s, d := src.Addr().As4(), dst.Addr().As4()
	h := uint32(flowHashSeed)
	for _, k := range [4]uint32{
		uint32(s[0])<<24 | uint32(s[1])<<16 | uint32(s[2])<<8 | uint32(s[3]),
		uint32(d[0])<<24 | uint32(d[1])<<16 | uint32(d[2])<<8 | uint32(d[3]),
		uint32(src.Port())<<16 | uint32(dst.Port()),
		uint32(proto),
	} {
		k *= 0xcc9e2d51
		k = bits.RotateLeft32(k, 15)
		k *= 0x1b873593
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	h ^= 16
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
