package bpf_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// A packet from outside to a frontend without backends is refused as a
// closed port would be, not dropped (issue 25: the client hung until its
// timeout while `agent service list` said "rejects connections"): a TCP
// segment gets a reset, a UDP datagram ICMP port unreachable, both from
// the frontend, sent back out of the device to the MAC the packet came
// from. A frontend with a backend still translates.

// tcpSegment is a frame with a TCP segment from src to dst with flags,
// sequence and acknowledgement numbers, a 4-byte option and payload, with
// right checksums.
func tcpSegment(src, dst netip.AddrPort, flags monitorapi.TCPFlags, seq, ackSeq uint32, payload string) []byte {
	l4 := tcpHeader(src.Port(), dst.Port(), flags)
	binary.BigEndian.PutUint32(l4[4:], seq)
	binary.BigEndian.PutUint32(l4[8:], ackSeq)
	l4[12] = 6 << 4
	l4 = append(l4, 2, 4, 0x05, 0xb4) // MSS 1460
	l4 = append(l4, payload...)
	ip := ipv4Header(src.Addr(), dst.Addr(), unix.IPPROTO_TCP, len(l4))
	binary.BigEndian.PutUint16(ip[10:], ^csumFold(csumAdd(0, ip)))
	binary.BigEndian.PutUint16(l4[16:], ^csumFold(l4Sum(unix.IPPROTO_TCP, src.Addr(), dst.Addr(), l4)))
	return ethernet(unix.ETH_P_IP, append(ip, l4...))
}

// turnedAround checks that out's Ethernet header is in's turned around.
func turnedAround(t *testing.T, in, out []byte) {
	t.Helper()
	if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || !bytes.Equal(out[12:14], in[12:14]) {
		t.Errorf("Ethernet header %x, want %x's turned around", out[:14], in[:14])
	}
}

func TestNodePortRejectTCP(t *testing.T) {
	n := loadNodePort(t)
	empty := netip.AddrPortFrom(nodeAddr, 30081)
	n.service(empty, lbmap.TCP)

	for _, tc := range []struct {
		name          string
		flags         monitorapi.TCPFlags
		seq, ackSeq   uint32
		payload       string
		wantFlags     monitorapi.TCPFlags
		wantSeq, wAck uint32
	}{
		// No ACK: the reset acknowledges the SYN (and any data).
		{"SYN", syn, 1000, 0, "", rstAck, 0, 1001},
		{"SYN with data", syn, 1000, 0, "abc", rstAck, 0, 1004},
		// An ACK names the sequence number the reset takes.
		{"ACK", ack, 5000, 777, "hello", monitorapi.TCPRst, 777, 0},
		{"FIN", finAck, 5000, 778, "", monitorapi.TCPRst, 778, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tcpSegment(client, empty, tc.flags, tc.seq, tc.ackSeq, tc.payload)
			out := n.run(n.ingress, in, verdictRedirect)
			if len(out) != 14+20+20 {
				t.Fatalf("reset is %d bytes, want %d: %x", len(out), 14+20+20, out)
			}
			turnedAround(t, in, out)
			src, dst := parsed4(t, out)
			if src != empty || dst != client {
				t.Errorf("reset %v -> %v, want %v -> %v", src, dst, empty, client)
			}
			ip, tcp := out[14:34], out[34:]
			if ip[9] != unix.IPPROTO_TCP || ip[8] != 64 {
				t.Errorf("IPv4 protocol %d TTL %d, want TCP, 64", ip[9], ip[8])
			}
			if got := monitorapi.TCPFlags(tcp[13]); got != tc.wantFlags {
				t.Errorf("flags %#x, want %#x", got, tc.wantFlags)
			}
			if got := tcp[12] >> 4; got != 5 {
				t.Errorf("data offset %d, want 5 (no options)", got)
			}
			if seq, ackSeq := binary.BigEndian.Uint32(tcp[4:]), binary.BigEndian.Uint32(tcp[8:]); seq != tc.wantSeq || ackSeq != tc.wAck {
				t.Errorf("seq %d ack %d, want %d %d", seq, ackSeq, tc.wantSeq, tc.wAck)
			}
		})
	}
	t.Run("RST", func(t *testing.T) {
		// A reset is never answered.
		n.run(n.ingress, tcpSegment(client, empty, monitorapi.TCPRst, 1, 0, ""), verdictDrop)
	})
	noNAT(t, n)
}

func TestNodePortRejectUDP(t *testing.T) {
	n := loadNodePort(t)
	empty := netip.AddrPortFrom(nodeAddr, 30053)
	n.service(empty, lbmap.UDP)

	in := checksummed4(unix.IPPROTO_UDP, client, empty, "a query longer than the quote")
	out := n.run(n.ingress, in, verdictRedirect)
	if want := 14 + 20 + 8 + 20 + 8; len(out) != want {
		t.Fatalf("ICMP error is %d bytes, want %d: %x", len(out), want, out)
	}
	turnedAround(t, in, out)
	got := parsedICMP(t, out, false)
	want := icmpSeen{src: empty.Addr(), dst: client.Addr(), typ: icmpUnreachable, code: icmpPortUnreach,
		innerSrc: client, innerDst: empty}
	if got != want {
		t.Errorf("ICMP error %+v, want %+v", got, want)
	}
	if quote := out[14+20+8:]; !bytes.Equal(quote, in[14:14+28]) {
		t.Errorf("quote %x, want the datagram's first 28 bytes %x", quote, in[14:14+28])
	}
	noNAT(t, n)
}

// A frontend with a backend is translated as before, next to one without.
func TestNodePortRejectOnlyEmpty(t *testing.T) {
	for _, tc := range l4Protos {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePort(t)
			empty := netip.AddrPortFrom(nodeAddr, 30081)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(empty, tc.lb)
			n.service(fe, tc.lb, localPod)
			n.run(n.ingress, checksummed4(tc.proto, client, empty, "x"), verdictRedirect)
			src, dst := parsed4(t, n.run(n.ingress, checksummed4(tc.proto, client, fe, "x"), verdictNext))
			if src != client || dst != localPod {
				t.Errorf("ingress made %v -> %v, want %v -> %v", src, dst, client, localPod)
			}
		})
	}
}

// noNAT checks that a refusal left no NAT entry behind.
func noNAT(t *testing.T, n *nodeport) {
	t.Helper()
	var key nodeportmap.Key4
	var val nodeportmap.NAT4
	if it := n.nat.Iterate(); it.Next(&key, &val) {
		t.Errorf("NAT entry %v -> %v for a refused packet", key, val)
	}
}

// A NodePort of traffic policy Local with no backend on this node drops,
// as kube-proxy does, rather than refusing: the service may have backends
// on other nodes, and a load balancer learns that this node has none from
// the health check node port, not from its clients' connections refused.
func TestNodePortLocalWithoutBackendDrops(t *testing.T) {
	n := loadNodePort(t)
	local := netip.AddrPortFrom(nodeAddr, 30082)
	master := lbmap.NewServiceMaster(0, n.nextRevNAT, lbmap.ServiceLocal, 0)
	n.nextRevNAT++
	if err := n.services.Put(lbmap.NewService4Key(local.Addr(), local.Port(), lbmap.TCP, 0), master); err != nil {
		t.Fatal(err)
	}
	n.run(n.ingress, tcpSegment(client, local, syn, 1000, 0, ""), verdictDrop)
}
