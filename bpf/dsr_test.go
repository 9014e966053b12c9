package bpf_test

import (
	"encoding/binary"
	"net/netip"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/bpf/bpftest"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// The DSR tests (--lb-mode=dsr, bpf/include/dsr.h): the NodePort ingress
// program sends a remote backend the client's packet with the frontend
// in an IPv4 option, and the endpoint programs of the backend's node learn
// the frontend from it and send the pod's replies from it.

// remotePod2 is a second backend in the remote pods' range.
var remotePod2 = netip.MustParseAddrPort("10.244.1.3:8080")

// withIPOptions is frame (Ethernet, IPv4 without options) with opts
// after the IPv4 header, whose length, total length and checksum it fixes.
func withIPOptions(frame, opts []byte) []byte {
	out := append([]byte{}, frame[:34]...)
	out = append(out, opts...)
	out = append(out, frame[34:]...)
	ip := out[14 : 34+len(opts)]
	ip[0] = 0x40 | byte(len(ip)/4)
	binary.BigEndian.PutUint16(ip[2:], binary.BigEndian.Uint16(ip[2:])+uint16(len(opts)))
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], ^csumFold(csumAdd(0, ip)))
	return out
}

// dsrOption is the option naming frontend fe.
func dsrOption(fe netip.AddrPort) []byte {
	a := fe.Addr().As4()
	opt := []byte{0x9e, 8, 0, 0}
	binary.BigEndian.PutUint16(opt[2:], fe.Port())
	return append(opt, a[:]...)
}

// parsedOpts4 checks an Ethernet frame's IPv4 header (its lengths against
// the frame, its checksum) and transport checksum, and returns its
// options, addresses and ports.
func parsedOpts4(t *testing.T, frame []byte) (opts []byte, src, dst netip.AddrPort) {
	t.Helper()
	ihl := int(frame[14]&0x0f) * 4
	totLen := int(binary.BigEndian.Uint16(frame[16:]))
	if frame[14]>>4 != 4 || ihl < 20 || 14+totLen != len(frame) {
		t.Fatalf("IPv4 header %x: version/length %#x, total length %d, frame of %d bytes", frame[14:34], frame[14], totLen, len(frame))
	}
	ip := frame[14 : 14+ihl]
	if csumFold(csumAdd(0, ip)) != 0xffff {
		t.Errorf("IPv4 header checksum is wrong: %x", ip)
	}
	seg := frame[14+ihl : 14+totLen]
	srcAddr := netip.AddrFrom4([4]byte(ip[12:16]))
	dstAddr := netip.AddrFrom4([4]byte(ip[16:20]))
	if csumFold(l4Sum(ip[9], srcAddr, dstAddr, seg)) != 0xffff {
		t.Errorf("transport checksum (protocol %d) is wrong", ip[9])
	}
	return ip[20:], netip.AddrPortFrom(srcAddr, binary.BigEndian.Uint16(seg[0:])),
		netip.AddrPortFrom(dstAddr, binary.BigEndian.Uint16(seg[2:]))
}

// loadNodePortDSR loads the NodePort programs with lb_mode dsr, and the
// node address of BPF_PROG_TEST_RUN's device, loopback.
func loadNodePortDSR(t *testing.T) *nodeport {
	n := loadNodePortWith(t, func(spec *ebpf.CollectionSpec) {
		if err := spec.Variables[bpf.NodePortVarLbMode].Set(uint32(1)); err != nil {
			t.Fatal(err)
		}
	})
	if err := n.devices.Put(uint32(1), nodeportmap.Device4{Address: lbmap.NewAddr4(nodeAddr)}); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *nodeport) fallbacks() uint64 {
	n.t.Helper()
	var v uint64
	if err := n.dsrFallbacks.Get(&v); err != nil {
		n.t.Fatal(err)
	}
	return v
}

// TestNodePortDSR: with lb_mode dsr, every packet of a connection to a
// remote backend leaves for the same backend with the client's address,
// the frontend in the option right after the 20-byte header, and valid
// lengths and checksums; the NAT map holds the connection's backend and no
// reply entry. A later packet with options of its own goes without the
// DSR option, to the same backend.
func TestNodePortDSR(t *testing.T) {
	nsPath := remoteBackendNS(t)
	for _, tc := range l4Protos {
		t.Run(tc.name, func(t *testing.T) {
			n := loadNodePortDSR(t)
			fe := netip.AddrPortFrom(nodeAddr, 30080)
			n.service(fe, tc.lb, remotePod, remotePod2)
			run := func(pkt []byte, want uint32) []byte {
				t.Helper()
				return n.runIn(nsPath, n.ingress, pkt, want)
			}

			var backend netip.AddrPort
			for i, payload := range []string{"first", "second packet", "third"} {
				pkt := checksummed4(tc.proto, client, fe, payload)
				fwd := run(pkt, verdictRedirect)
				if len(fwd) != len(pkt)+8 {
					t.Fatalf("packet %d: %d bytes after ingress, want %d (8 more for the option)", i, len(fwd), len(pkt)+8)
				}
				opts, src, dst := parsedOpts4(t, fwd)
				if want := dsrOption(fe); !reflect.DeepEqual(opts, want) {
					t.Errorf("packet %d: IPv4 options %x, want %x", i, opts, want)
				}
				if ttl := fwd[14+8]; ttl != 63 {
					t.Errorf("packet %d: TTL %d after forwarding, want 63", i, ttl)
				}
				if src != client || (dst != remotePod && dst != remotePod2) {
					t.Fatalf("packet %d: ingress made %v -> %v, want %v -> a backend", i, src, dst, client)
				}
				if i > 0 && dst != backend {
					t.Fatalf("packet %d went to %v, the first to %v", i, dst, backend)
				}
				backend = dst
				if got := string(fwd[len(fwd)-len(payload):]); got != payload {
					t.Errorf("packet %d: payload %q, want %q", i, got, payload)
				}
			}

			// Options of its own: no room for the DSR option at its
			// place; the backend's node knows the connection already.
			withOpts := withIPOptions(checksummed4(tc.proto, client, fe, "options"), []byte{1, 1, 1, 0})
			opts, src, dst := parsedOpts4(t, run(withOpts, verdictRedirect))
			if !reflect.DeepEqual(opts, []byte{1, 1, 1, 0}) || src != client || dst != backend {
				t.Errorf("packet with options: %x %v -> %v, want its own options and %v -> %v", opts, src, dst, client, backend)
			}

			proto := lbmap.Proto(tc.proto)
			want := map[nodeportmap.Key4]nodeportmap.NAT4{
				nodeportmap.NewKey4(proto, client, fe, nodeportmap.DirIn): nodeportmap.NewDSR4(backend, 1),
			}
			if got := withoutLifetimes(n.natEntries()); !reflect.DeepEqual(got, want) {
				t.Errorf("NAT entries:\n got %v\nwant %v", got, want)
			}
			if got := n.fallbacks(); got != 0 {
				t.Errorf("dsr_fallbacks = %d, want 0", got)
			}
		})
	}
}

// TestNodePortDSRRouteMTU: the 8 bytes of the option count against the
// MTU of the device the route to the backend leaves by (in tunnel mode
// the tunnel device, smaller than the device the client's packets come
// in on): a packet that fits that MTU only without the option is sent to
// the backend without it, not dropped on the way out.
func TestNodePortDSRRouteMTU(t *testing.T) {
	const mtu = 1400
	nsPath := remoteBackendNS(t)
	if err := nettest.Do(nsPath, func() error {
		dev, err := netlink.LinkByName("np0")
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(dev, mtu)
	}); err != nil {
		t.Fatal(err)
	}
	n := loadNodePortDSR(t)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	n.service(fe, lbmap.TCP, remotePod)
	for _, tc := range []struct {
		name     string
		l3Len    int
		wantOpts bool
	}{
		{"first", 60, true},
		{"room for the option", mtu - 8, true},
		{"no room for the option", mtu - 4, false},
		{"room again", 200, true},
	} {
		pkt := checksummed4(unix.IPPROTO_TCP, client, fe, string(make([]byte, tc.l3Len-40)))
		opts, src, dst := parsedOpts4(t, n.runIn(nsPath, n.ingress, pkt, verdictRedirect))
		if src != client || dst != remotePod {
			t.Fatalf("%s packet: %v -> %v, want %v -> %v", tc.name, src, dst, client, remotePod)
		}
		if got := len(opts) > 0; got != tc.wantOpts {
			t.Errorf("%s packet (%d bytes, route MTU %d): option %x, want an option: %v", tc.name, tc.l3Len, mtu, opts, tc.wantOpts)
		}
	}
}

// TestNodePortDSRFallback: a connection whose first packet has IPv4
// options cannot take the DSR option, so it goes to the remote backend
// with SNAT, as in snat mode, and dsr_fallbacks counts it.
func TestNodePortDSRFallback(t *testing.T) {
	nsPath := remoteBackendNS(t)
	n := loadNodePortDSR(t)
	fe := netip.AddrPortFrom(nodeAddr, 30080)
	n.service(fe, lbmap.TCP, remotePod)
	pkt := withIPOptions(checksummed4(unix.IPPROTO_TCP, client, fe, "x"), []byte{1, 1, 1, 0})
	opts, src, dst := parsedOpts4(t, n.runIn(nsPath, n.ingress, pkt, verdictRedirect))
	if !reflect.DeepEqual(opts, []byte{1, 1, 1, 0}) || src.Addr() != nodeAddr || src.Port() < 61000 || dst != remotePod {
		t.Fatalf("ingress made %x %v -> %v, want options 01010100 and %v:61000-65535 -> %v (SNAT)", opts, src, dst, nodeAddr, remotePod)
	}
	if got := n.fallbacks(); got != 1 {
		t.Errorf("dsr_fallbacks = %d, want 1", got)
	}
	for k, v := range n.natEntries() {
		if v.Flags != nodeportmap.FlagSNAT {
			t.Errorf("NAT entry %v -> %v, want SNAT", k, v)
		}
	}
}

// lxcDSR loads the endpoint programs with lb_dsr set to dsr.
func lxcDSR(t *testing.T, dsr uint32) *lxc {
	return loadLXC(t, lxcOptions{edit: func(spec *ebpf.CollectionSpec) {
		if err := spec.Variables[bpf.LXCVarLbDsr].Set(dsr); err != nil {
			t.Fatal(err)
		}
	}})
}

// TestLXCDSR: a packet into a pod that carries the DSR option records the
// connection's frontend, and the pod's replies on it leave from the
// frontend with valid checksums; other replies are left alone. The
// option stays in the packet: Linux ignores an option it does not know.
func TestLXCDSR(t *testing.T) {
	fe := netip.AddrPortFrom(netip.MustParseAddr("10.90.0.11"), 30080)
	pod := netip.AddrPortFrom(podA, 8080)
	for _, tc := range l4Protos {
		t.Run(tc.name, func(t *testing.T) {
			l := lxcDSR(t, 1)
			in := withIPOptions(checksummed4(tc.proto, client, pod, "request"), dsrOption(fe))
			l.run(l.to, in, verdictNext)
			var got nodeportmap.DSR4
			key := nodeportmap.NewDSRKey4(tc.lb, pod, client)
			if err := l.dsr.Lookup(key, &got); err != nil {
				t.Fatalf("DSR entry %v: %v", key, err)
			}
			if want := nodeportmap.NewDSR4Frontend(fe); got != want {
				t.Errorf("DSR entry %v = %v, want %v", key, got, want)
			}

			reply := checksummed4(tc.proto, pod, client, "reply")
			opts := &ebpf.RunOptions{Data: reply, DataOut: make([]byte, len(reply)+64)}
			l.runWith(opts, l.from, verdictNext)
			_, src, dst := parsedOpts4(t, opts.DataOut)
			if src != fe || dst != client {
				t.Errorf("reply: from-endpoint made %v -> %v, want %v -> %v", src, dst, fe, client)
			}

			if tc.proto == unix.IPPROTO_TCP {
				// A SYN without the option opens another
				// connection on the tuple: its replies are the
				// pod's own.
				syn := checksummed4(tc.proto, client, pod, "")
				syn[14+20+13] = byte(monitorapi.TCPSyn)
				l.run(l.to, syn, verdictNext)
				if err := l.dsr.Lookup(key, &got); err == nil {
					t.Errorf("DSR entry %v -> %v after a SYN without the option", key, got)
				}
			}

			// Another client's reply is no DSR connection's.
			other := netip.MustParseAddrPort("10.90.0.201:40000")
			reply = checksummed4(tc.proto, pod, other, "reply")
			opts = &ebpf.RunOptions{Data: reply, DataOut: make([]byte, len(reply)+64)}
			l.runWith(opts, l.from, verdictNext)
			if !reflect.DeepEqual(opts.DataOut, reply) {
				t.Errorf("from-endpoint changed a reply of no DSR connection")
			}
		})
	}
}

// TestLXCDSROff: without --lb-mode=dsr the option is ignored.
func TestLXCDSROff(t *testing.T) {
	l := lxcDSR(t, 0)
	fe := netip.AddrPortFrom(netip.MustParseAddr("10.90.0.11"), 30080)
	pod := netip.AddrPortFrom(podA, 8080)
	l.run(l.to, withIPOptions(checksummed4(unix.IPPROTO_TCP, client, pod, "request"), dsrOption(fe)), verdictNext)
	var k nodeportmap.DSRKey4
	var v nodeportmap.DSR4
	if l.dsr.Iterate().Next(&k, &v) {
		t.Errorf("DSR entry %v -> %v with lb_dsr 0", k, v)
	}
}

// TestDSRMapLayout compares the Go mirrors with the C structs.
func TestDSRMapLayout(t *testing.T) {
	spec, err := bpf.LoadLXC()
	if err != nil {
		t.Fatal(err)
	}
	bpftest.CompareMap(t, bpf.LXCMapCelliumLb4Dsr, spec.Maps[bpf.LXCMapCelliumLb4Dsr],
		reflect.TypeFor[nodeportmap.DSRKey4](), reflect.TypeFor[nodeportmap.DSR4]())
}
