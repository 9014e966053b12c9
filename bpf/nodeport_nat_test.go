package bpf_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// The NAT entries' lifetimes (bpf/include/nodeport_nat.h): set on creation,
// refreshed in both entries by either direction's packets, shortened once
// the connection closes, and an expired entry's SNAT port is taken over.

// Lifetimes distinct from each other and from the defaults, so that a test
// tells which one an entry got.
const (
	natLifetimeSyn    = 31
	natLifetimeTCP    = 1001
	natLifetimeClose  = 7
	natLifetimeNonTCP = 53
)

func loadNodePortLifetimes(t *testing.T, natMax uint32) *nodeport {
	t.Helper()
	return loadNodePortWith(t, func(spec *ebpf.CollectionSpec) {
		for name, v := range map[string]uint32{
			bpf.NodePortVarCtLifetimeSyn:    natLifetimeSyn,
			bpf.NodePortVarCtLifetimeTcp:    natLifetimeTCP,
			bpf.NodePortVarCtLifetimeClose:  natLifetimeClose,
			bpf.NodePortVarCtLifetimeNontcp: natLifetimeNonTCP,
		} {
			if err := spec.Variables[name].Set(v); err != nil {
				t.Fatalf("set %s: %v", name, err)
			}
		}
		spec.Maps[bpf.NodePortMapCelliumNodeport4Nat].MaxEntries = natMax
	})
}

// withoutLifetimes is entries with their lifetimes and states zeroed, for
// tests of the translation alone.
func withoutLifetimes(entries map[nodeportmap.Key4]nodeportmap.NAT4) map[nodeportmap.Key4]nodeportmap.NAT4 {
	out := make(map[nodeportmap.Key4]nodeportmap.NAT4, len(entries))
	for k, v := range entries {
		v.Lifetime, v.State = 0, 0
		out[k] = v
	}
	return out
}

// checkLifetimes wants exactly two entries, both with state and a lifetime
// of plus seconds after a time in w.
func (n *nodeport) checkLifetimes(what string, w window, state, plus uint32) map[nodeportmap.Key4]nodeportmap.NAT4 {
	n.t.Helper()
	entries := n.natEntries()
	if len(entries) != 2 {
		n.t.Fatalf("%s: %d NAT entries, want 2: %v", what, len(entries), entries)
	}
	for k, v := range entries {
		if v.State != state {
			n.t.Errorf("%s: entry %v has state %#x, want %#x", what, k, v.State, state)
		}
		w.check(n.t, what+": lifetime of "+k.String(), v.Lifetime, plus)
	}
	return entries
}

// TestNodePortNATLifetimeLocalBackend: a TCP connection to a local backend
// gets the SYN lifetime, the long one once the backend answers, and the
// close lifetime once both sides sent a FIN; a packet of either direction
// refreshes both entries; a SYN on the closed tuple starts over. UDP gets
// the non-TCP lifetime.
func TestNodePortNATLifetimeLocalBackend(t *testing.T) {
	n := loadNodePortLifetimes(t, 1024)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	n.service(fe, lbmap.TCP, localPod)
	in := nodeportmap.NewKey4(lbmap.TCP, client, fe, nodeportmap.DirIn)
	out := nodeportmap.NewKey4(lbmap.TCP, localPod, client, nodeportmap.DirOut)

	w := during(func() { n.run(n.ingress, tcpPacket(client, fe, syn), verdictNext) })
	n.checkLifetimes("SYN", w, 0, natLifetimeSyn)

	w = during(func() { n.run(n.egress, tcpPacket(localPod, client, synAck), verdictNext) })
	n.checkLifetimes("SYN-ACK", w, nodeportmap.StateReply, natLifetimeTCP)

	// Both entries aged by hand: the client's next packet refreshes the
	// reply's entry too, and the backend's the client's.
	for _, by := range []struct {
		what string
		prog *ebpf.Program
		pkt  []byte
	}{
		{"client's ACK", n.ingress, tcpPacket(client, fe, ack)},
		{"backend's ACK", n.egress, tcpPacket(localPod, client, ack)},
	} {
		n.age(in, out)
		w = during(func() { n.run(by.prog, by.pkt, verdictNext) })
		n.checkLifetimes(by.what, w, nodeportmap.StateReply, natLifetimeTCP)
	}

	w = during(func() { n.run(n.ingress, tcpPacket(client, fe, finAck), verdictNext) })
	n.checkLifetimes("client's FIN", w, nodeportmap.StateReply|nodeportmap.StateInFIN, natLifetimeTCP)
	w = during(func() { n.run(n.egress, tcpPacket(localPod, client, finAck), verdictNext) })
	n.checkLifetimes("backend's FIN", w, nodeportmap.StateReply|nodeportmap.StateInFIN|nodeportmap.StateOutFIN, natLifetimeClose)

	w = during(func() { n.run(n.ingress, tcpPacket(client, fe, syn), verdictNext) })
	n.checkLifetimes("SYN on the closed tuple", w, 0, natLifetimeSyn)

	w = during(func() { n.run(n.ingress, tcpPacket(client, fe, rstAck), verdictNext) })
	n.checkLifetimes("RST", w, nodeportmap.StateReply|nodeportmap.StateRST, natLifetimeClose)

	// A client's ACK of the handshake says the backend answered, even
	// if its reply did not pass here.
	w = during(func() { n.run(n.ingress, tcpPacket(client, fe, syn), verdictNext) })
	n.checkLifetimes("SYN on the reset tuple", w, 0, natLifetimeSyn)
	w = during(func() { n.run(n.ingress, tcpPacket(client, fe, ack), verdictNext) })
	n.checkLifetimes("client's ACK alone", w, nodeportmap.StateReply, natLifetimeTCP)

	u := loadNodePortLifetimes(t, 1024)
	u.service(fe, lbmap.UDP, localPod)
	w = during(func() { u.run(u.ingress, udpPacket(client, fe), verdictNext) })
	u.checkLifetimes("UDP", w, 0, natLifetimeNonTCP)
	w = during(func() { u.run(u.egress, udpPacket(localPod, client), verdictNext) })
	u.checkLifetimes("UDP reply", w, nodeportmap.StateReply, natLifetimeNonTCP)
}

// age sets the lifetime of the entries under keys to one second from now:
// live, but not what a packet would set.
func (n *nodeport) age(keys ...nodeportmap.Key4) {
	n.t.Helper()
	for _, k := range keys {
		var v nodeportmap.NAT4
		if err := n.nat.Lookup(k, &v); err != nil {
			n.t.Fatalf("look up %v: %v", k, err)
		}
		v.Lifetime = nowSeconds() + 1
		if err := n.nat.Put(k, v); err != nil {
			n.t.Fatal(err)
		}
	}
}

func nowSeconds() uint32 { return during(func() {}).from }

// TestNodePortNATLifetimeRemoteBackend: the SNAT'd connection's reply,
// which the ingress program translates, refreshes both entries and moves
// them on; a client's RST closes them.
func TestNodePortNATLifetimeRemoteBackend(t *testing.T) {
	nettest.RequireRoot(t)
	nsPath := remoteBackendNS(t)
	n := loadNodePortLifetimes(t, 1024)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	n.service(fe, lbmap.TCP, remotePod)
	if err := n.devices.Put(uint32(1), nodeportmap.Device4{Address: lbmap.NewAddr4(nodeAddr)}); err != nil {
		t.Fatal(err)
	}
	var fwd []byte
	w := during(func() { fwd = n.runIn(nsPath, n.ingress, tcpPacket(client, fe, syn), verdictRedirect) })
	n.checkLifetimes("SYN", w, 0, natLifetimeSyn)
	snat, _ := parsed4NoCsum(fwd)
	in := nodeportmap.NewKey4(lbmap.TCP, client, fe, nodeportmap.DirIn)
	out := nodeportmap.NewKey4(lbmap.TCP, remotePod, snat, nodeportmap.DirOut)

	n.age(in, out)
	w = during(func() { n.runIn(nsPath, n.ingress, tcpPacket(remotePod, snat, synAck), verdictRedirect) })
	n.checkLifetimes("SYN-ACK", w, nodeportmap.StateReply, natLifetimeTCP)

	w = during(func() { n.runIn(nsPath, n.ingress, tcpPacket(client, fe, rstAck), verdictRedirect) })
	n.checkLifetimes("RST", w, nodeportmap.StateReply|nodeportmap.StateRST, natLifetimeClose)
}

// parsed4NoCsum is the source and destination of a frame, whose checksums
// the test's hand-made TCP packets do not get right.
func parsed4NoCsum(frame []byte) (src, dst netip.AddrPort) {
	ip := frame[14:34]
	seg := frame[34:]
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), uint16(seg[0])<<8|uint16(seg[1])),
		netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), uint16(seg[2])<<8|uint16(seg[3]))
}

// TestNodePortSNATPortTakeover: with every SNAT port toward the backend
// held by another connection, a new connection takes over the port of one
// whose entry expired (the garbage collector has not run), and is dropped
// while they are all live.
func TestNodePortSNATPortTakeover(t *testing.T) {
	nettest.RequireRoot(t)
	nsPath := remoteBackendNS(t)
	const ports = 65536 - 61000
	for _, tc := range []struct {
		name    string
		expired bool
	}{
		{"expired", true},
		{"live", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePortLifetimes(t, 4*ports)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(fe, lbmap.TCP, remotePod)
			if err := n.devices.Put(uint32(1), nodeportmap.Device4{Address: lbmap.NewAddr4(nodeAddr)}); err != nil {
				t.Fatal(err)
			}
			// Every port holds another client's connection.
			now := nowSeconds()
			lifetime := now + 100
			if tc.expired {
				lifetime = now - 1
			}
			other := netip.MustParseAddr("10.90.0.201")
			keys := make([]nodeportmap.Key4, 0, ports)
			vals := make([]nodeportmap.NAT4, 0, ports)
			for p := 61000; p < 65536; p++ {
				v := nodeportmap.NewSNAT4(fe, 1, netip.AddrPortFrom(other, uint16(p)))
				v.Lifetime, v.State = lifetime, nodeportmap.StateReply
				keys = append(keys, nodeportmap.NewKey4(lbmap.TCP, remotePod, netip.AddrPortFrom(nodeAddr, uint16(p)), nodeportmap.DirOut))
				vals = append(vals, v)
			}
			if _, err := n.nat.BatchUpdate(keys, vals, nil); err != nil {
				t.Fatal(err)
			}

			if !tc.expired {
				n.runIn(nsPath, n.ingress, tcpPacket(client, fe, syn), verdictDrop)
				if got := len(n.natEntries()); got != ports {
					t.Errorf("%d NAT entries after a refused connection, want the %d there were", got, ports)
				}
				return
			}
			fwd := n.runIn(nsPath, n.ingress, tcpPacket(client, fe, syn), verdictRedirect)
			snat, _ := parsed4NoCsum(fwd)
			var v nodeportmap.NAT4
			if err := n.nat.Lookup(nodeportmap.NewKey4(lbmap.TCP, remotePod, snat, nodeportmap.DirOut), &v); err != nil {
				t.Fatalf("reply entry of the new connection from %v: %v", snat, err)
			}
			if v.SNATAddress != lbmap.NewAddr4(client.Addr()) || v.SNATPort != lbmap.NewPort(client.Port()) {
				t.Errorf("port %v still answers %v, want the new client %v", snat, v, client)
			}
			if v.Expired(nowSeconds()) {
				t.Errorf("taken-over entry %v is expired", v)
			}
			if got := len(n.natEntries()); got != ports+1 {
				t.Errorf("%d NAT entries, want %d: the %d ports and the new connection's own", got, ports+1, ports)
			}
		})
	}
}
