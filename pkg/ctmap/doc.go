// Package ctmap is the Go side of the conntrack maps of bpf/include/ct.h:
// the keys and the entry, laid out byte for byte like their C structs, the
// flag bits, and the clock the entries' times are on.
//
// The contract:
//
//   - [Key4], [Key6] and [Entry] have the size and field offsets of struct
//     ct4_key, ct6_key and ct_entry, padding included as blank fields;
//     TestLXCLayoutsMatchBTF in bpf/lxc_test.go checks this against the BTF
//     of the compiled datapath.
//   - A key is a connection's tuple in its ORIGINAL direction, as the
//     initiator sent its first packet. A packet of the reply direction is
//     looked up with the tuple reversed ([Key4.Reverse]). Addresses and
//     ports are in network byte order. For ICMP and ICMPv6 echo, SrcPort is
//     the echo identifier and DstPort is 0; other protocols without ports
//     have both 0.
//   - [KeyIncoming] in Key.Flags says which program made the entry: set, the
//     to-endpoint program (the connection came into the endpoint); clear,
//     the from-endpoint program (the endpoint opened it). A connection
//     between two endpoints of the node therefore has two entries, one per
//     endpoint, each with its own EndpointID and counters. Bit 0 is
//     reserved and 0.
//   - Times (Entry.Lifetime, LastTx, LastRx) are seconds on CLOCK_BOOTTIME,
//     which is what the programs read (bpf_ktime_get_boot_ns) and what
//     [Now] returns: an entry has expired when Lifetime < Now().
//   - Tx is the original direction, Rx the reply direction.
//
// The package knows the layouts only; the maps are declared by the ct-maps
// cell (cells/ctmaps), written by the programs of bpf/lxc.c and collected by
// the ct-gc cell.
//
//	key := ctmap.NewKey4(unix.IPPROTO_TCP,
//		netip.MustParseAddrPort("10.244.0.2:40000"), netip.MustParseAddrPort("10.244.0.3:80"), 0)
//	e, err := maps.TCP4.Lookup(key)        // the client's entry (from-endpoint)
//	expired := e.Lifetime < ctmap.Now()
//	fmt.Println(key, e)                    // TCP 10.244.0.2:40000 -> 10.244.0.3:80 out  ESTABLISHED ...
package ctmap
