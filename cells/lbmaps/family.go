package lbmaps

import (
	"net/netip"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/pkg/lbmap"
)

// family is one address family's maps and how to build and read their
// entries. The reconciler's logic is written once over it, for IPv4 and IPv6.
type family[SK comparable, B, R any] struct {
	is4      bool
	services *bpfmaps.Map[SK, lbmap.ServiceValue]
	backends *bpfmaps.Map[lbmap.BackendID, B]
	revNAT   *bpfmaps.Map[lbmap.RevNATIndex, R]
	maglev   *MaglevMap

	serviceKey func(addr netip.Addr, port uint16, proto lbmap.Proto, slot uint16) SK
	backend    func(addr netip.Addr, port uint16, proto lbmap.Proto) B
	revNATOf   func(addr netip.Addr, port uint16) R

	// For restore: what an entry read back from a map says.
	keyOf      func(SK) (fe netip.AddrPort, proto lbmap.Proto, slot uint16)
	backendOf  func(B) (netip.AddrPort, lbmap.Proto)
	revNATAddr func(R) netip.AddrPort
}

func ipv4(m *Maps) *family[lbmap.Service4Key, lbmap.Backend4, lbmap.RevNAT4] {
	return &family[lbmap.Service4Key, lbmap.Backend4, lbmap.RevNAT4]{
		is4:        true,
		services:   m.Services4,
		backends:   m.Backends4,
		revNAT:     m.RevNAT4,
		maglev:     m.Maglev4,
		serviceKey: lbmap.NewService4Key,
		backend:    lbmap.NewBackend4,
		revNATOf:   lbmap.NewRevNAT4,
		keyOf: func(k lbmap.Service4Key) (netip.AddrPort, lbmap.Proto, uint16) {
			return k.AddrPort(), k.Proto, k.BackendSlot
		},
		backendOf:  func(b lbmap.Backend4) (netip.AddrPort, lbmap.Proto) { return b.AddrPort(), b.Proto },
		revNATAddr: lbmap.RevNAT4.AddrPort,
	}
}

func ipv6(m *Maps) *family[lbmap.Service6Key, lbmap.Backend6, lbmap.RevNAT6] {
	return &family[lbmap.Service6Key, lbmap.Backend6, lbmap.RevNAT6]{
		services:   m.Services6,
		backends:   m.Backends6,
		revNAT:     m.RevNAT6,
		maglev:     m.Maglev6,
		serviceKey: lbmap.NewService6Key,
		backend:    lbmap.NewBackend6,
		revNATOf:   lbmap.NewRevNAT6,
		keyOf: func(k lbmap.Service6Key) (netip.AddrPort, lbmap.Proto, uint16) {
			return k.AddrPort(), k.Proto, k.BackendSlot
		},
		backendOf:  func(b lbmap.Backend6) (netip.AddrPort, lbmap.Proto) { return b.AddrPort(), b.Proto },
		revNATAddr: lbmap.RevNAT6.AddrPort,
	}
}
