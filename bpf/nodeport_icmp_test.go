package bpf_test

import (
	"encoding/binary"
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// The ICMP tests (bpf/include/nodeport_icmp.h): an ICMP error about a
// packet of a NodePort-translated connection is translated as well, the
// quoted header and the error's own addresses, with every checksum right;
// an error about anything else passes untouched. The NAT entries come
// from running the connection's packets through the programs first.

const (
	icmpFragNeeded   = 4  // code of destination unreachable
	icmpPortUnreach  = 3  // code of destination unreachable
	icmpTimeExceeded = 11 // type
	quoteMTU         = 1200
)

// node2 is the router between node-1 and the remote backend.
var node2 = netip.MustParseAddr("10.90.0.12")

// icmpError is an ICMP error from src to dst quoting the IPv4 packet of
// frame, cut to quoteLen bytes (0: all of it), with a right checksum; a
// fragmentation needed says the next hop's MTU is quoteMTU.
func icmpError(src, dst netip.Addr, typ, code uint8, frame []byte, quoteLen int) []byte {
	quote := frame[14:]
	if quoteLen > 0 {
		quote = quote[:quoteLen]
	}
	msg := make([]byte, 8, 8+len(quote))
	msg[0], msg[1] = typ, code
	if typ == icmpUnreachable && code == icmpFragNeeded {
		binary.BigEndian.PutUint16(msg[6:], quoteMTU)
	}
	msg = append(msg, quote...)
	binary.BigEndian.PutUint16(msg[2:], ^csumFold(csumAdd(0, msg)))
	ip := ipv4Header(src, dst, unix.IPPROTO_ICMP, len(msg))
	binary.BigEndian.PutUint16(ip[10:], ^csumFold(csumAdd(0, ip)))
	return ethernet(unix.ETH_P_IP, append(ip, msg...))
}

// icmpSeen is what a translated error says.
type icmpSeen struct {
	src, dst           netip.Addr     // of the error
	typ, code          uint8          // unchanged
	mtu                uint16         // unchanged
	innerSrc, innerDst netip.AddrPort // of the quote
}

// parsedICMP checks an ICMP error's IPv4, ICMP and quoted IPv4 checksums,
// and the quoted transport checksum when fullQuote says the quote holds
// the whole segment, and returns what it says.
func parsedICMP(t *testing.T, frame []byte, fullQuote bool) icmpSeen {
	t.Helper()
	ip := frame[14:34]
	if csumFold(csumAdd(0, ip)) != 0xffff {
		t.Errorf("IPv4 header checksum is wrong: %x", ip)
	}
	msg := frame[34 : 14+int(binary.BigEndian.Uint16(ip[2:]))]
	if csumFold(csumAdd(0, msg)) != 0xffff {
		t.Errorf("ICMP checksum is wrong: %x", msg)
	}
	inner := msg[8:]
	if csumFold(csumAdd(0, inner[:20])) != 0xffff {
		t.Errorf("quoted IPv4 header checksum is wrong: %x", inner[:20])
	}
	innerSrc := netip.AddrFrom4([4]byte(inner[12:16]))
	innerDst := netip.AddrFrom4([4]byte(inner[16:20]))
	seg := inner[20:]
	if fullQuote && csumFold(l4Sum(inner[9], innerSrc, innerDst, seg)) != 0xffff {
		t.Errorf("quoted transport checksum (protocol %d) is wrong", inner[9])
	}
	return icmpSeen{
		src:      netip.AddrFrom4([4]byte(ip[12:16])),
		dst:      netip.AddrFrom4([4]byte(ip[16:20])),
		typ:      msg[0],
		code:     msg[1],
		mtu:      binary.BigEndian.Uint16(msg[6:]),
		innerSrc: netip.AddrPortFrom(innerSrc, binary.BigEndian.Uint16(seg[0:])),
		innerDst: netip.AddrPortFrom(innerDst, binary.BigEndian.Uint16(seg[2:])),
	}
}

// runIn runs prog on pkt in the namespace at nsPath, whose routes its FIB
// lookups see.
func (n *nodeport) runIn(nsPath string, prog *ebpf.Program, pkt []byte, want uint32) (out []byte) {
	n.t.Helper()
	err := nettest.Do(nsPath, func() error {
		out = n.run(prog, pkt, want)
		return nil
	})
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// quoteCases: the quotes an error may carry, whole or cut.
var quoteCases = []struct {
	name     string
	proto    uint8
	lb       lbmap.Proto
	typ      uint8
	code     uint8
	quoteLen int // 0: the whole packet
}{
	// Fragmentation needed about a UDP datagram, quoted whole, its
	// checksum translated too.
	{"UDP frag needed", unix.IPPROTO_UDP, lbmap.UDP, icmpUnreachable, icmpFragNeeded, 0},
	// RFC 792's quote, 8 bytes of TCP: no checksum in it.
	{"TCP frag needed, 8 bytes quoted", unix.IPPROTO_TCP, lbmap.TCP, icmpUnreachable, icmpFragNeeded, 28},
	{"TCP time exceeded, whole", unix.IPPROTO_TCP, lbmap.TCP, icmpTimeExceeded, 0, 0},
	{"UDP port unreachable", unix.IPPROTO_UDP, lbmap.UDP, icmpUnreachable, icmpPortUnreach, 0},
}

// TestNodePortICMPRemoteBackend: a connection to a backend on another
// node. An error about a packet sent to the backend (fragmentation needed
// from node-2 to the node address) goes to the client, from the frontend,
// quoting client -> frontend; an error from the client about a reply
// goes to the backend, from the node address, quoting backend ->
// node:natport. Both are redirected, their TTL decremented.
func TestNodePortICMPRemoteBackend(t *testing.T) {
	nsPath := remoteBackendNS(t)
	for _, tc := range quoteCases {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePort(t)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(fe, tc.lb, remotePod)
			if err := n.devices.Put(uint32(1), nodeportmap.Device4{Address: lbmap.NewAddr4(nodeAddr)}); err != nil {
				t.Fatal(err)
			}
			fwd := n.runIn(nsPath, n.ingress, checksummed4(tc.proto, client, fe, "request payload"), verdictRedirect)
			snat, _ := parsed4(t, fwd)
			full := tc.quoteLen == 0

			// node-2 about the forwarded packet, to the node.
			pkt := icmpError(node2, nodeAddr, tc.typ, tc.code, fwd, tc.quoteLen)
			out := n.runIn(nsPath, n.ingress, pkt, verdictRedirect)
			got := parsedICMP(t, out, full)
			want := icmpSeen{fe.Addr(), client.Addr(), tc.typ, tc.code, mtuOf(tc.typ, tc.code), client, fe}
			if got != want {
				t.Errorf("error about the forwarded packet:\n got %+v\nwant %+v", got, want)
			}
			if ttl := out[14+8]; ttl != 63 {
				t.Errorf("error's TTL %d after forwarding, want 63", ttl)
			}
			if len(out) != len(pkt) {
				t.Errorf("error's length %d, want %d", len(out), len(pkt))
			}

			// The client about the reply it got.
			reply := n.runIn(nsPath, n.ingress, checksummed4(tc.proto, remotePod, snat, "reply payload"), verdictRedirect)
			pkt = icmpError(client.Addr(), fe.Addr(), tc.typ, tc.code, reply, tc.quoteLen)
			out = n.runIn(nsPath, n.ingress, pkt, verdictRedirect)
			got = parsedICMP(t, out, full)
			want = icmpSeen{nodeAddr, remotePod.Addr(), tc.typ, tc.code, mtuOf(tc.typ, tc.code), remotePod, snat}
			if got != want {
				t.Errorf("error about the reply:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// mtuOf is the MTU icmpError puts in an error of typ and code.
func mtuOf(typ, code uint8) uint16 {
	if typ == icmpUnreachable && code == icmpFragNeeded {
		return quoteMTU
	}
	return 0
}

// TestNodePortICMPLocalBackend: a connection to a backend on this node
// (DNAT only). An error about a packet to the backend leaving the device
// (the node's fragmentation needed, the backend's port unreachable)
// quotes client -> frontend, and the backend's comes from the frontend;
// an error from the client about a reply goes on to the stack to the
// backend, quoting backend -> client.
func TestNodePortICMPLocalBackend(t *testing.T) {
	for _, tc := range quoteCases {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePort(t)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(fe, tc.lb, localPod)
			full := tc.quoteLen == 0
			mtu := mtuOf(tc.typ, tc.code)

			fwd := n.run(n.ingress, checksummed4(tc.proto, client, fe, "request payload"), verdictNext)
			for _, from := range []struct {
				name string
				src  netip.Addr
				want netip.Addr
			}{
				{"the node", nodeAddr, nodeAddr},
				{"the backend", localPod.Addr(), fe.Addr()},
			} {
				pkt := icmpError(from.src, client.Addr(), tc.typ, tc.code, fwd, tc.quoteLen)
				got := parsedICMP(t, n.run(n.egress, pkt, verdictNext), full)
				want := icmpSeen{from.want, client.Addr(), tc.typ, tc.code, mtu, client, fe}
				if got != want {
					t.Errorf("error from %s about the packet to the backend:\n got %+v\nwant %+v", from.name, got, want)
				}
			}

			reply := n.run(n.egress, checksummed4(tc.proto, localPod, client, "reply payload"), verdictNext)
			pkt := icmpError(client.Addr(), fe.Addr(), tc.typ, tc.code, reply, tc.quoteLen)
			got := parsedICMP(t, n.run(n.ingress, pkt, verdictNext), full)
			want := icmpSeen{client.Addr(), localPod.Addr(), tc.typ, tc.code, mtu, localPod, client}
			if got != want {
				t.Errorf("error about the reply:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// TestNodePortICMPUDPNoChecksum: a quoted UDP checksum of 0 (none) stays 0.
func TestNodePortICMPUDPNoChecksum(t *testing.T) {
	n := loadNodePort(t)
	fe := netip.AddrPortFrom(nodeAddr, 30053)
	n.service(fe, lbmap.UDP, localPod)
	req := checksummed4(unix.IPPROTO_UDP, client, fe, "query")
	binary.BigEndian.PutUint16(req[14+20+6:], 0)
	fwd := n.run(n.ingress, req, verdictNext)
	out := n.run(n.egress, icmpError(nodeAddr, client.Addr(), icmpUnreachable, icmpFragNeeded, fwd, 0), verdictNext)
	got := parsedICMP(t, out, false)
	if got.innerDst != fe {
		t.Errorf("quoted destination %v, want %v", got.innerDst, fe)
	}
	if c := binary.BigEndian.Uint16(out[14+20+8+20+6:]); c != 0 {
		t.Errorf("quoted UDP checksum %#x, want 0 (none)", c)
	}
}

// TestNodePortICMPUntouched: with connections translated, ICMP errors
// that are about none of them, are not addressed to the quoted packet's
// source, are not errors, or quote too little to hold the ports pass
// unchanged, at ingress and at egress.
func TestNodePortICMPUntouched(t *testing.T) {
	nsPath := remoteBackendNS(t)
	n := loadNodePort(t)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	remoteFE := netip.AddrPortFrom(nodeAddr, 30090)
	n.service(fe, lbmap.UDP, localPod)
	n.service(remoteFE, lbmap.UDP, remotePod)
	if err := n.devices.Put(uint32(1), nodeportmap.Device4{Address: lbmap.NewAddr4(nodeAddr)}); err != nil {
		t.Fatal(err)
	}
	localFwd := n.runIn(nsPath, n.ingress, checksummed4(unix.IPPROTO_UDP, client, fe, "x"), verdictNext)
	remoteFwd := n.runIn(nsPath, n.ingress, checksummed4(unix.IPPROTO_UDP, client, remoteFE, "x"), verdictRedirect)
	entries := n.natEntries()

	other := checksummed4(unix.IPPROTO_UDP, netip.MustParseAddrPort("10.90.0.11:40000"), netip.MustParseAddrPort("10.244.1.9:53"), "x")
	otherClient := netip.MustParseAddrPort("10.90.0.201:40000")
	for _, tc := range []struct {
		name string
		prog *ebpf.Program
		pkt  []byte
	}{
		{"about another connection", n.ingress, icmpError(node2, nodeAddr, icmpUnreachable, icmpFragNeeded, other, 0)},
		{"about the node's own to the backend", n.ingress, icmpError(node2, nodeAddr, icmpUnreachable, icmpFragNeeded,
			checksummed4(unix.IPPROTO_UDP, netip.AddrPortFrom(nodeAddr, 1000), remotePod, "x"), 0)},
		{"not to the quoted source", n.ingress, icmpError(node2, otherClient.Addr(), icmpUnreachable, icmpFragNeeded, remoteFwd, 0)},
		{"quote without ports", n.ingress, icmpError(node2, nodeAddr, icmpUnreachable, icmpFragNeeded, remoteFwd, 22)},
		{"quote cut in the IPv4 header", n.ingress, icmpError(node2, nodeAddr, icmpUnreachable, icmpFragNeeded, remoteFwd, 12)},
		{"redirect is no error", n.ingress, icmpError(node2, nodeAddr, 5, 0, remoteFwd, 0)},
		{"echo", n.ingress, icmpPacket(client.Addr(), nodeAddr, icmpEcho, 0, 1)},
		{"egress: about another connection", n.egress, icmpError(nodeAddr, client.Addr(), icmpUnreachable, icmpFragNeeded,
			checksummed4(unix.IPPROTO_UDP, client, netip.MustParseAddrPort("10.244.0.9:53"), "x"), 0)},
		{"egress: not to the quoted source", n.egress, icmpError(nodeAddr, otherClient.Addr(), icmpUnreachable, icmpFragNeeded, localFwd, 0)},
		{"egress: about a remote backend's", n.egress, icmpError(node2, nodeAddr, icmpUnreachable, icmpFragNeeded, remoteFwd, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := n.runIn(nsPath, tc.prog, tc.pkt, verdictNext)
			if !reflect.DeepEqual(out, tc.pkt) {
				t.Errorf("the program changed the packet:\n got %x\nwant %x", out, tc.pkt)
			}
		})
	}
	if got := n.natEntries(); !reflect.DeepEqual(got, entries) {
		t.Errorf("ICMP errors changed the NAT entries:\n got %v\nwant %v", got, entries)
	}
}

// TestNodePortICMPPadding: a frame longer than its IPv4 packet (Ethernet
// padding) after a quote that ends before the TCP checksum: the quote is
// translated, the padding is not taken for the checksum and stays as it
// was.
func TestNodePortICMPPadding(t *testing.T) {
	n := loadNodePort(t)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	n.service(fe, lbmap.TCP, localPod)
	fwd := n.run(n.ingress, checksummed4(unix.IPPROTO_TCP, client, fe, "request"), verdictNext)
	pkt := icmpError(nodeAddr, client.Addr(), icmpUnreachable, icmpFragNeeded, fwd, 28)
	padding := []byte{0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa, 0xaa}
	out := n.run(n.egress, append(pkt, padding...), verdictNext)
	got := parsedICMP(t, out, false)
	if got.innerDst != fe {
		t.Errorf("quoted destination %v, want %v", got.innerDst, fe)
	}
	if tail := out[len(pkt):]; !reflect.DeepEqual(tail, padding) {
		t.Errorf("padding after the message became %x, want %x", tail, padding)
	}
}
