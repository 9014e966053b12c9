// Package lbmap is the Go side of the load-balancing maps of bpf/include/lb.h:
// one type per key and value, laid out byte for byte like its C struct.
//
// The contract:
//
//   - Every type has the size and field offsets of its C struct, padding
//     included as blank fields; lbmap_test.go checks this against the BTF of
//     the compiled object, so Go and C cannot drift apart.
//   - Addresses and ports are stored in network byte order, as the kernel
//     hands them to the programs. The constructors take a netip.Addr and a
//     host-order port, and the accessors give them back, so no caller swaps
//     bytes. A constructor for an IPv4 type panics on an IPv6 address and
//     the reverse, as netip.Addr.As4 does: choosing the family is the
//     caller's job.
//   - Each type has a String method that decodes it, for map dumps.
//
// The package knows the layouts only; the maps themselves are declared by
// the lb-maps cell (cells/lbmaps).
//
// A service 10.96.0.10:80/TCP with two backends is its backends, one entry
// per slot, a master entry (slot 0) and the reverse NAT of its frontend,
// written in that order so that the master's count never names a missing
// slot:
//
//	fe := netip.MustParseAddr("10.96.0.10")
//	backends.Put(1, lbmap.NewBackend4(netip.MustParseAddr("10.244.1.5"), 8080, lbmap.TCP))
//	backends.Put(2, lbmap.NewBackend4(netip.MustParseAddr("10.244.2.9"), 8080, lbmap.TCP))
//	services.Put(lbmap.NewService4Key(fe, 80, lbmap.TCP, 1), lbmap.NewServiceSlot(1, 7))
//	services.Put(lbmap.NewService4Key(fe, 80, lbmap.TCP, 2), lbmap.NewServiceSlot(2, 7))
//	services.Put(lbmap.NewService4Key(fe, 80, lbmap.TCP, 0), lbmap.NewServiceMaster(2, 7, 0, 0))
//	revNAT.Put(7, lbmap.NewRevNAT4(fe, 80))
package lbmap
