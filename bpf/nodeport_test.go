package bpf_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/bpf/bpftest"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/maglev"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// The NodePort tests run the device programs of nodeport.c on crafted
// packets with BPF_PROG_TEST_RUN, against maps of their own: a client
// outside the cluster sends to a frontend of the node, the ingress program
// must hand the packet to a backend, and the backend's reply, through the
// egress program, must come back from the frontend, with valid checksums
// both ways.

var (
	client   = netip.MustParseAddrPort("10.90.0.200:40000")
	nodeAddr = netip.MustParseAddr("10.90.0.11")
	// localPod is an endpoint of the node, remotePod is not.
	localPod  = netip.MustParseAddrPort("10.244.0.2:8080")
	remotePod = netip.MustParseAddrPort("10.244.1.2:8080")
)

// l4Protos are the transport protocols the NodePort programs translate,
// for tests that run once per protocol.
var l4Protos = []struct {
	name  string
	proto uint8
	lb    lbmap.Proto
}{
	{"TCP", unix.IPPROTO_TCP, lbmap.TCP},
	{"UDP", unix.IPPROTO_UDP, lbmap.UDP},
}

type nodeport struct {
	t                *testing.T
	ingress, egress  *ebpf.Program
	services         *ebpf.Map
	backends         *ebpf.Map
	nat              *ebpf.Map
	devices          *ebpf.Map
	endpoints        *ebpf.Map
	maglev           *ebpf.Map
	nextBackend      lbmap.BackendID
	nextRevNAT       lbmap.RevNATIndex
	localEndpointsID uint16
	dsrFallbacks     *ebpf.Variable
}

func loadNodePort(t *testing.T) *nodeport { return loadNodePortWith(t, nil) }

// loadNodePortWith is loadNodePort with edit applied to the spec before
// loading.
func loadNodePortWith(t *testing.T, edit func(*ebpf.CollectionSpec)) *nodeport {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	spec, err := bpf.LoadNodePort()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		switch m.Type {
		case ebpf.LRUHash, ebpf.Hash:
			m.MaxEntries = 1024
		}
	}
	if edit != nil {
		edit(spec)
	}
	coll := bpftest.Load(t, spec)
	n := &nodeport{
		t:           t,
		ingress:     coll.Programs[bpf.NodePortProgCelliumNodeportIngress],
		egress:      coll.Programs[bpf.NodePortProgCelliumNodeportEgress],
		services:    coll.Maps[bpf.NodePortMapCelliumLb4Services],
		backends:    coll.Maps[bpf.NodePortMapCelliumLb4Backends],
		nat:         coll.Maps[bpf.NodePortMapCelliumNodeport4Nat],
		nextBackend: 1,
		nextRevNAT:  1,
	}
	n.devices = coll.Maps[bpf.NodePortMapCelliumNodeport4Devices]
	n.endpoints = coll.Maps[bpf.NodePortMapCelliumEndpoints]
	n.maglev = coll.Maps[bpf.NodePortMapCelliumLb4Maglev]
	n.dsrFallbacks = coll.Variables[bpf.NodePortVarDsrFallbacks]
	info := endpointmaps.EndpointInfo{IfIndex: 100, EndpointID: 7}
	if err := n.endpoints.Put(endpointmaps.KeyOf(localPod.Addr()), info); err != nil {
		t.Fatal(err)
	}
	return n
}

// service puts a frontend with backends into the maps, as the lb-maps
// reconciler writes them.
func (n *nodeport) service(fe netip.AddrPort, proto lbmap.Proto, backends ...netip.AddrPort) {
	n.t.Helper()
	rev := n.nextRevNAT
	n.nextRevNAT++
	master := lbmap.NewServiceMaster(uint16(len(backends)), rev, 0, 0)
	if err := n.services.Put(lbmap.NewService4Key(fe.Addr(), fe.Port(), proto, 0), master); err != nil {
		n.t.Fatal(err)
	}
	for i, be := range backends {
		id := n.nextBackend
		n.nextBackend++
		if err := n.backends.Put(id, lbmap.NewBackend4(be.Addr(), be.Port(), proto)); err != nil {
			n.t.Fatal(err)
		}
		if err := n.services.Put(lbmap.NewService4Key(fe.Addr(), fe.Port(), proto, uint16(i+1)), lbmap.NewServiceSlot(id, rev)); err != nil {
			n.t.Fatal(err)
		}
	}
}

// run runs prog on pkt, wants verdict want and returns the packet as the
// program left it.
func (n *nodeport) run(prog *ebpf.Program, pkt []byte, want uint32) []byte {
	n.t.Helper()
	out := make([]byte, len(pkt)+256)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out}
	got, err := prog.Run(opts)
	if err != nil {
		n.t.Fatal(err)
	}
	if got != want {
		n.t.Fatalf("program returned %#x, want %#x", got, want)
	}
	return opts.DataOut
}

// checksummed4 is an Ethernet frame with a TCP or UDP IPv4 packet whose
// checksums are right.
func checksummed4(proto uint8, src, dst netip.AddrPort, payload string) []byte {
	var l4 []byte
	if proto == unix.IPPROTO_TCP {
		l4 = append(tcpHeader(src.Port(), dst.Port(), ack), payload...)
	} else {
		l4 = make([]byte, 8, 8+len(payload))
		binary.BigEndian.PutUint16(l4[0:], src.Port())
		binary.BigEndian.PutUint16(l4[2:], dst.Port())
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(payload)))
		l4 = append(l4, payload...)
	}
	ip := ipv4Header(src.Addr(), dst.Addr(), proto, len(l4))
	binary.BigEndian.PutUint16(ip[10:], ^csumFold(csumAdd(0, ip)))
	binary.BigEndian.PutUint16(l4[l4CsumOff(proto):], ^csumFold(l4Sum(proto, src.Addr(), dst.Addr(), l4)))
	return ethernet(unix.ETH_P_IP, append(ip, l4...))
}

func l4CsumOff(proto uint8) int {
	if proto == unix.IPPROTO_TCP {
		return 16
	}
	return 6
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func csumFold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// l4Sum is the one's complement sum of the pseudo header and segment.
func l4Sum(proto uint8, src, dst netip.Addr, seg []byte) uint32 {
	s, d := src.As4(), dst.As4()
	sum := csumAdd(0, s[:])
	sum = csumAdd(sum, d[:])
	sum += uint32(proto) + uint32(len(seg))
	return csumAdd(sum, seg)
}

// parsed4 checks an Ethernet frame's IPv4 and transport checksums and
// returns its addresses and ports.
func parsed4(t *testing.T, frame []byte) (src, dst netip.AddrPort) {
	t.Helper()
	ip := frame[14:34]
	if csumFold(csumAdd(0, ip)) != 0xffff {
		t.Errorf("IPv4 header checksum is wrong: %x", ip)
	}
	proto := ip[9]
	seg := frame[34 : 14+int(binary.BigEndian.Uint16(ip[2:]))]
	srcAddr := netip.AddrFrom4([4]byte(ip[12:16]))
	dstAddr := netip.AddrFrom4([4]byte(ip[16:20]))
	if csumFold(l4Sum(proto, srcAddr, dstAddr, seg)) != 0xffff {
		t.Errorf("transport checksum (protocol %d) is wrong", proto)
	}
	return netip.AddrPortFrom(srcAddr, binary.BigEndian.Uint16(seg[0:])),
		netip.AddrPortFrom(dstAddr, binary.BigEndian.Uint16(seg[2:]))
}

// TestNodePortLocalBackend: a connection from outside to the node's
// address and NodePort reaches the local backend with the client's address,
// every packet of it reaches the same backend, and the replies come back
// from the frontend.
// TestNodePortMaglevFlowHash: a Maglev frontend sends a connection from
// outside to the backend in the table's slot maglev.FlowHash4 % size: a
// function of the packet alone, so every node picks the same backend for
// it. (The kernel's skb hash, seeded at boot, would differ between
// nodes.)
func TestNodePortMaglevFlowHash(t *testing.T) {
	var innerSpec *ebpf.MapSpec
	n := loadNodePortWith(t, func(spec *ebpf.CollectionSpec) {
		innerSpec = spec.Maps[bpf.NodePortMapCelliumLb4Maglev].InnerMap.Copy()
	})
	pods := []netip.AddrPort{localPod}
	for i := range 3 {
		pod := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(3 + i)}), 8080)
		if err := n.endpoints.Put(endpointmaps.KeyOf(pod.Addr()), endpointmaps.EndpointInfo{IfIndex: uint32(101 + i), EndpointID: uint16(8 + i)}); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
	}
	fe := netip.AddrPortFrom(nodeAddr, 30090)
	rev := n.nextRevNAT
	n.service(fe, lbmap.TCP, pods...) // backend IDs 1 to 4, in pods' order
	if err := n.services.Put(lbmap.NewService4Key(fe.Addr(), fe.Port(), lbmap.TCP, 0),
		lbmap.NewServiceMaster(uint16(len(pods)), rev, lbmap.ServiceMaglev, 0)); err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.String()
	}
	slots, err := maglev.Table(names, maglev.DefaultSize)
	if err != nil {
		t.Fatal(err)
	}
	table := make([]lbmap.BackendID, len(slots))
	for i, b := range slots {
		table[i] = lbmap.BackendID(b + 1)
	}
	inner, err := ebpf.NewMap(innerSpec)
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if err := inner.Put(uint32(0), table); err != nil {
		t.Fatal(err)
	}
	if err := n.maglev.Put(uint16(rev), inner); err != nil {
		t.Fatal(err)
	}

	reached := map[netip.AddrPort]int{}
	for port := uint16(40000); port < 40064; port++ {
		from := netip.AddrPortFrom(client.Addr(), port)
		want := pods[slots[maglev.FlowHash4(from, fe, unix.IPPROTO_TCP)%uint32(len(slots))]]
		_, dst := parsed4(t, n.run(n.ingress, checksummed4(unix.IPPROTO_TCP, from, fe, "hello"), verdictNext))
		if dst != want {
			t.Fatalf("connection from %v went to %v, want the table's %v", from, dst, want)
		}
		reached[dst]++
	}
	if len(reached) < 2 {
		t.Fatalf("64 connections reached only %v: the hash does not spread", reached)
	}
}

func TestNodePortLocalBackend(t *testing.T) {
	for _, tc := range l4Protos {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePort(t)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(fe, tc.lb, localPod)

			for i, payload := range []string{"first", "second packet"} {
				in := n.run(n.ingress, checksummed4(tc.proto, client, fe, payload), verdictNext)
				src, dst := parsed4(t, in)
				if src != client || dst != localPod {
					t.Fatalf("packet %d: ingress made %v -> %v, want %v -> %v", i, src, dst, client, localPod)
				}
				out := n.run(n.egress, checksummed4(tc.proto, localPod, client, "reply"), verdictNext)
				src, dst = parsed4(t, out)
				if src != fe || dst != client {
					t.Fatalf("reply %d: egress made %v -> %v, want %v -> %v", i, src, dst, fe, client)
				}
			}

			entries := n.natEntries()
			proto := lbmap.Proto(tc.proto)
			want := map[nodeportmap.Key4]nodeportmap.NAT4{
				nodeportmap.NewKey4(proto, client, fe, nodeportmap.DirIn):        nodeportmap.NewNAT4(localPod, 1),
				nodeportmap.NewKey4(proto, localPod, client, nodeportmap.DirOut): nodeportmap.NewNAT4(fe, 1),
			}
			if !reflect.DeepEqual(withoutLifetimes(entries), want) {
				t.Errorf("NAT entries:\n got %v\nwant %v", entries, want)
			}
		})
	}
}

// TestNodePortUDPNoChecksum: a UDP datagram without a checksum (0) keeps
// none; writing a computed one into it would make it wrong.
func TestNodePortUDPNoChecksum(t *testing.T) {
	n := loadNodePort(t)
	fe := netip.AddrPortFrom(nodeAddr, 30053)
	n.service(fe, lbmap.UDP, localPod)
	pkt := checksummed4(unix.IPPROTO_UDP, client, fe, "query")
	binary.BigEndian.PutUint16(pkt[14+20+6:], 0)
	in := n.run(n.ingress, pkt, verdictNext)
	if got := binary.BigEndian.Uint16(in[14+20+6:]); got != 0 {
		t.Errorf("UDP checksum = %#x after translation, want 0 (none)", got)
	}
	if dst := netip.AddrFrom4([4]byte(in[30:34])); dst != localPod.Addr() {
		t.Errorf("destination = %v, want %v", dst, localPod.Addr())
	}
}

// TestNodePortUntouched: what is no frontend, no TCP or UDP, or a reply
// of no translated connection passes unchanged; a remote backend passes
// unchanged while the device has no node address to send from.
func TestNodePortUntouched(t *testing.T) {
	n := loadNodePort(t)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	remoteFE := netip.AddrPortFrom(nodeAddr, 30082)
	n.service(fe, lbmap.TCP, localPod)
	n.service(remoteFE, lbmap.TCP, remotePod)

	for _, tc := range []struct {
		name string
		prog *ebpf.Program
		pkt  []byte
		want uint32
	}{
		{"other port", n.ingress, checksummed4(unix.IPPROTO_TCP, client, netip.AddrPortFrom(nodeAddr, 22), "x"), verdictNext},
		{"other protocol", n.ingress, checksummed4(unix.IPPROTO_UDP, client, fe, "x"), verdictNext},
		{"ICMP", n.ingress, icmpPacket(client.Addr(), nodeAddr, icmpEcho, 0, 1), verdictNext},
		{"IPv6", n.ingress, tcpPacket(netip.MustParseAddrPort("[2001:db8::1]:1000"), netip.MustParseAddrPort("[2001:db8::2]:30080"), syn), verdictNext},
		{"remote backend, no node address", n.ingress, checksummed4(unix.IPPROTO_TCP, client, remoteFE, "x"), verdictNext},
		{"untranslated reply", n.egress, checksummed4(unix.IPPROTO_TCP, localPod, client, "x"), verdictNext},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := n.run(tc.prog, tc.pkt, tc.want)
			if tc.want == verdictNext && !reflect.DeepEqual(out, tc.pkt) {
				t.Errorf("the program changed the packet:\n got %x\nwant %x", out, tc.pkt)
			}
		})
	}
	var key nodeportmap.Key4
	var val nodeportmap.NAT4
	if it := n.nat.Iterate(); it.Next(&key, &val) {
		t.Errorf("NAT entry %v -> %v for a packet that was not translated", key, val)
	}
}

// TestNodePortMapLayout compares the Go mirrors with the C structs.
func TestNodePortMapLayout(t *testing.T) {
	spec, err := bpf.LoadNodePort()
	if err != nil {
		t.Fatal(err)
	}
	bpftest.CompareMap(t, bpf.NodePortMapCelliumNodeport4Nat, spec.Maps[bpf.NodePortMapCelliumNodeport4Nat],
		reflect.TypeFor[nodeportmap.Key4](), reflect.TypeFor[nodeportmap.NAT4]())
}

const verdictRedirect = uint32(7) // TC_ACT_REDIRECT

// natEntries are the NAT map's entries.
func (n *nodeport) natEntries() map[nodeportmap.Key4]nodeportmap.NAT4 {
	n.t.Helper()
	var key nodeportmap.Key4
	var val nodeportmap.NAT4
	entries := map[nodeportmap.Key4]nodeportmap.NAT4{}
	it := n.nat.Iterate()
	for it.Next(&key, &val) {
		entries[key] = val
	}
	if err := it.Err(); err != nil {
		n.t.Fatal(err)
	}
	return entries
}

// TestNodePortRemoteBackend: a packet for a backend on another node leaves
// from the node's address and a port of the SNAT range, redirected to the
// device the route to the backend names; the backend's reply, arriving at
// the node's address, goes back to the client from the frontend. The
// programs run in a namespace of the test's own whose routes the FIB
// lookups see (BPF_PROG_TEST_RUN runs them on its loopback device).
func TestNodePortRemoteBackend(t *testing.T) {
	nsPath := remoteBackendNS(t)

	for _, tc := range l4Protos {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePort(t)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(fe, tc.lb, remotePod)
			// BPF_PROG_TEST_RUN's packets arrive on loopback, ifindex 1.
			if err := n.devices.Put(uint32(1), nodeportmap.Device4{Address: lbmap.NewAddr4(nodeAddr)}); err != nil {
				t.Fatal(err)
			}
			run := func(prog *ebpf.Program, pkt []byte, want uint32) []byte {
				t.Helper()
				return n.runIn(nsPath, prog, pkt, want)
			}

			var snat netip.AddrPort
			for i := range 2 {
				fwd := run(n.ingress, checksummed4(tc.proto, client, fe, "request"), verdictRedirect)
				if ttl := fwd[14+8]; ttl != 63 {
					t.Errorf("packet %d: TTL %d after forwarding, want 63", i, ttl)
				}
				src, dst := parsed4(t, fwd)
				if src.Addr() != nodeAddr || src.Port() < 61000 || dst != remotePod {
					t.Fatalf("packet %d: ingress made %v -> %v, want %v:61000-65535 -> %v", i, src, dst, nodeAddr, remotePod)
				}
				if i > 0 && src != snat {
					t.Fatalf("packet %d leaves from %v, the first from %v", i, src, snat)
				}
				snat = src
			}
			// A TTL that would run out on the way is dropped.
			expiring := checksummed4(tc.proto, client, fe, "request")
			expiring[14+8] = 1
			run(n.ingress, expiring, verdictDrop)

			src, dst := parsed4(t, run(n.ingress, checksummed4(tc.proto, remotePod, snat, "reply"), verdictRedirect))
			if src != fe || dst != client {
				t.Fatalf("reply: ingress made %v -> %v, want %v -> %v", src, dst, fe, client)
			}
			// The egress program leaves such a reply alone: it was
			// translated at ingress.
			reply := checksummed4(tc.proto, remotePod, client, "reply")
			if out := run(n.egress, reply, verdictNext); !reflect.DeepEqual(out, reply) {
				t.Errorf("egress changed a packet of a remote backend's connection")
			}

			proto := lbmap.Proto(tc.proto)
			want := map[nodeportmap.Key4]nodeportmap.NAT4{
				nodeportmap.NewKey4(proto, client, fe, nodeportmap.DirIn):       nodeportmap.NewSNAT4(remotePod, 1, snat),
				nodeportmap.NewKey4(proto, remotePod, snat, nodeportmap.DirOut): nodeportmap.NewSNAT4(fe, 1, client),
			}
			if got := withoutLifetimes(n.natEntries()); !reflect.DeepEqual(got, want) {
				t.Errorf("NAT entries:\n got %v\nwant %v", got, want)
			}
		})
	}
}

// remoteBackendNS is a namespace whose routes the FIB lookups of the
// remote-backend path see, its path: the node's address on np0, the client's
// network on link, the remote pods through 10.90.0.12.
func remoteBackendNS(t *testing.T) string {
	t.Helper()
	nettest.RequireRoot(t)
	ns := nettest.NewNS(t)
	err := nettest.Do(ns.Path(), func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "np0"}, PeerName: "np0p"}); err != nil {
			return err
		}
		for _, name := range []string{"np0p", "np0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		dev, err := netlink.LinkByName("np0")
		if err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		// The FIB lookup of a packet forwarded past the stack fails while
		// the namespace does not forward, and a new namespace forwards
		// only if the host happens to (IPv4 settings are inherited).
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr(nodeAddr.String() + "/24")
		if err := netlink.AddrAdd(dev, addr); err != nil {
			return err
		}
		_, podNet, _ := net.ParseCIDR("10.244.1.0/24")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: dev.Attrs().Index, Dst: podNet, Gw: net.ParseIP("10.90.0.12")})
	})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Path()
}
