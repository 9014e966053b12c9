package bpf_test

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/bpf/bpftest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmaps"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/ipcachemap"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/policymap"
)

// The lxc tests run the TC programs on crafted packets with
// BPF_PROG_TEST_RUN, against maps of their own, and read what the programs
// left in the conntrack maps and the event ring buffer. Both programs of
// one load serve every endpoint, as on a node: they tell endpoints apart by
// the endpoint map. The from-endpoint program also checks that a packet
// came in on the interface of its source's endpoint, so each load has a
// network namespace with a veth pair whose two ends stand for the host
// sides of A's and B's veths, and a from-endpoint run happens there, on
// the interface of the packet's source (see runWith).

// Lifetimes of the tests, in seconds: apart from the defaults and from
// each other, so that an entry's lifetime says which one applied.
const (
	lifetimeSyn    = 7
	lifetimeTCP    = 1000
	lifetimeClose  = 3
	lifetimeNonTCP = 50
)

// Verdicts, as BPF_PROG_TEST_RUN returns them.
const (
	verdictNext = uint32(0xffffffff) // TC_ACT_UNSPEC, -1
	verdictDrop = uint32(2)          // TC_ACT_SHOT
)

// Endpoints of the node: pods A and B, with their IDs.
var (
	podA  = netip.MustParseAddr("10.244.0.2")
	podB  = netip.MustParseAddr("10.244.0.3")
	podA6 = netip.MustParseAddr("fd00:244::2")
	podB6 = netip.MustParseAddr("fd00:244::3")
	// remote is no endpoint of the node.
	remote  = netip.MustParseAddr("192.0.2.1")
	remote6 = netip.MustParseAddr("2001:db8::1")
)

const (
	epA uint16 = 11
	epB uint16 = 12
)

// lxc is one load of lxc.c with maps of its own.
type lxc struct {
	t        testing.TB
	from, to *ebpf.Program
	ct       map[string]*ebpf.Map
	ipcache  *ebpf.Map
	dsr      *ebpf.Map
	lost     *ebpf.Map
	// policy and enforcement are the policy maps of policy.h.
	policy      *ebpf.Map
	enforcement *ebpf.Map
	prefixes    *ebpf.Map
	// frags is the programs' own map of fragmented datagrams.
	frags *ebpf.Map
	ring  *ringbuf.Reader
	boot  monitorapi.BootClock
	// nsPath is the namespace of the endpoints' interfaces, devA and devB
	// their ifindexes there; ifindexOf maps each endpoint address to its
	// interface.
	nsPath     string
	devA, devB uint32
	ifindexOf  map[netip.Addr]uint32
	// lastIfIndex is the interface the last run ran on (1: lo).
	lastIfIndex uint32
}

type lxcOptions struct {
	aggregation bool
	// ringSize is the ring buffer's size; 0 for 64 KiB.
	ringSize uint32
	// edit changes the spec before loading.
	edit func(*ebpf.CollectionSpec)
}

// loadLXC loads the programs with the test lifetimes, through the
// ct-maps cell's ProgramConstants, as the loader sets them, and puts pods
// A and B (both families) into the endpoint map.
func loadLXC(t testing.TB, opts lxcOptions) *lxc {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	spec, err := bpf.LoadLXC()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		switch m.Type {
		case ebpf.RingBuf:
			m.MaxEntries = 64 << 10
			if opts.ringSize != 0 {
				m.MaxEntries = opts.ringSize
			}
		case ebpf.LRUHash, ebpf.Hash:
			m.MaxEntries = 1024
		}
	}
	cfg := ctmaps.Config{
		ConntrackLifetimeSyn:    lifetimeSyn * time.Second,
		ConntrackLifetimeTCP:    lifetimeTCP * time.Second,
		ConntrackLifetimeClose:  lifetimeClose * time.Second,
		ConntrackLifetimeNonTCP: lifetimeNonTCP * time.Second,
		MonitorAggregation:      opts.aggregation,
	}
	consts := cfg.ProgramConstants()
	for name, v := range consts {
		vs, ok := spec.Variables[name]
		if !ok {
			t.Fatalf("the program has no constant %s", name)
		}
		if err := vs.Set(v); err != nil {
			t.Fatalf("set %s: %v", name, err)
		}
	}
	if opts.edit != nil {
		opts.edit(spec)
	}
	coll := bpftest.Load(t, spec)

	l := &lxc{
		t:           t,
		from:        coll.Programs[bpf.LXCProgCelliumFromEndpoint],
		to:          coll.Programs[bpf.LXCProgCelliumToEndpoint],
		ct:          map[string]*ebpf.Map{},
		lost:        coll.Maps[ctmaps.MapEventsLost],
		ipcache:     coll.Maps[ipcachemap.MapName],
		dsr:         coll.Maps[bpf.LXCMapCelliumLb4Dsr],
		policy:      coll.Maps[policymap.MapName],
		enforcement: coll.Maps[policymap.EnforcementMapName],
		prefixes:    coll.Maps[policymap.PrefixMapName],
		frags:       coll.Maps[bpf.LXCMapCelliumFrags],
		boot:        monitorapi.SystemBootClock(),
	}
	for _, name := range []string{ctmaps.MapTCP4, ctmaps.MapAny4, ctmaps.MapTCP6, ctmaps.MapAny6} {
		l.ct[name] = coll.Maps[name]
	}
	l.ring, err = ringbuf.NewReader(coll.Maps[ctmaps.MapEvents])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.ring.Close() })

	l.nsPath, l.devA, l.devB = endpointDevices(t)
	l.ifindexOf = map[netip.Addr]uint32{podA: l.devA, podA6: l.devA, podB: l.devB, podB6: l.devB}
	endpoints := coll.Maps[bpf.LXCMapCelliumEndpoints]
	for addr, id := range map[netip.Addr]uint16{podA: epA, podB: epB, podA6: epA, podB6: epB} {
		info := endpointmaps.EndpointInfo{IfIndex: l.ifindexOf[addr], EndpointID: id}
		if err := endpoints.Put(endpointmaps.KeyOf(addr), info); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// endpointDevices makes a network namespace with a veth pair, lxca and
// lxcb, the host sides of A's and B's veths, and returns the namespace
// and their ifindexes. It is removed when the test ends.
func endpointDevices(t testing.TB) (string, uint32, uint32) {
	t.Helper()
	ns := nettest.NewNS(t)
	_, h := nettest.Netlink(t, ns.Path())
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lxca"}, PeerName: "lxcb"}); err != nil {
		t.Fatalf("veth pair in %s: %v", ns.Path(), err)
	}
	var idx [2]uint32
	for i, name := range []string{"lxca", "lxcb"} {
		link, err := h.LinkByName(name)
		if err != nil {
			t.Fatalf("%s in %s: %v", name, ns.Path(), err)
		}
		idx[i] = uint32(link.Attrs().Index)
	}
	return ns.Path(), idx[0], idx[1]
}

// on is l for a subtest: its failures are t's.
func (l *lxc) on(t *testing.T) *lxc {
	c := *l
	c.t = t
	return &c
}

// run runs prog on pkt and fails the test unless it returns want.
func (l *lxc) run(prog *ebpf.Program, pkt []byte, want uint32) {
	l.t.Helper()
	l.runWith(&ebpf.RunOptions{Data: pkt}, prog, want)
}

// runWith runs prog with opts. The from-endpoint program runs on the
// interface of the packet's source, as a pod's packet comes in on the host
// side of its own veth, or on lo (the interface of no endpoint) if the
// source is no endpoint's; the to-endpoint program on lo.
func (l *lxc) runWith(opts *ebpf.RunOptions, prog *ebpf.Program, want uint32) {
	l.t.Helper()
	var ifindex uint32
	if prog == l.from {
		ifindex = l.ifindexOf[packetSource(opts.Data)]
	}
	l.runOn(ifindex, opts, prog, want)
}

// runOn runs prog with opts on the interface ifindex of the endpoints'
// namespace, 0 for lo of the test's own.
func (l *lxc) runOn(ifindex uint32, opts *ebpf.RunOptions, prog *ebpf.Program, want uint32) {
	l.t.Helper()
	run := func() (uint32, error) { return prog.Run(opts) }
	l.lastIfIndex = 1
	if ifindex != 0 {
		o := *opts
		o.Context = withIfIndex(l.t, opts.Context, ifindex)
		run = func() (uint32, error) {
			return nettest.In(l.nsPath, func() (uint32, error) { return prog.Run(&o) })
		}
		defer func() { opts.DataOut = o.DataOut }()
		l.lastIfIndex = ifindex
	}
	got, err := run()
	if err != nil {
		l.t.Fatal(err)
	}
	if got != want {
		l.t.Fatalf("program returned %#x, want %#x", got, want)
	}
}

// packetSource is the source address of an Ethernet frame's IPv4 or IPv6
// packet, as far as the frame holds one; the zero Addr otherwise.
func packetSource(frame []byte) netip.Addr {
	if len(frame) < 14 {
		return netip.Addr{}
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case unix.ETH_P_IP:
		if len(frame) >= 14+16 {
			return netip.AddrFrom4([4]byte(frame[14+12 : 14+16]))
		}
	case unix.ETH_P_IPV6:
		if len(frame) >= 14+24 {
			return netip.AddrFrom16([16]byte(frame[14+8 : 14+24]))
		}
	}
	return netip.Addr{}
}

// withIfIndex is ctx (a struct __sk_buff, or nil for a zero one) with
// ifindex set: BPF_PROG_TEST_RUN runs the program on that interface of the
// caller's namespace.
func withIfIndex(t testing.TB, ctx any, ifindex uint32) []byte {
	t.Helper()
	var skb []byte
	switch c := ctx.(type) {
	case nil:
		skb = make([]byte, skbSize)
	case []byte:
		skb = slices.Clone(c)
	default:
		t.Fatalf("context %T: want a struct __sk_buff's bytes", ctx)
	}
	binary.NativeEndian.PutUint32(skb[skbIfIndexOffset:], ifindex)
	return skb
}

// ringEvents drains a ring buffer of event records. The programs write
// their records before they return, and the socket programs during the
// system calls, so whatever a run or a finished client reported is there
// already.
func ringEvents(t testing.TB, rd *ringbuf.Reader, boot monitorapi.BootClock) []monitorapi.Event {
	t.Helper()
	var evs []monitorapi.Event
	rd.SetDeadline(time.Now())
	for {
		rec, err := rd.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return evs
		}
		if err != nil {
			t.Fatal(err)
		}
		ev, err := monitorapi.Decode(rec.RawSample, boot)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
}

// events drains the ring buffer.
func (l *lxc) events() []monitorapi.Event {
	l.t.Helper()
	return ringEvents(l.t, l.ring, l.boot)
}

// oneEvent is the one event the last runs of l reported, of type T; what
// names it in failures.
func oneEvent[T monitorapi.Event](l *lxc, what string) T {
	l.t.Helper()
	evs := l.events()
	if len(evs) != 1 {
		l.t.Fatalf("events %v, want one %s event", evs, what)
	}
	ev, ok := evs[0].(T)
	if !ok {
		l.t.Fatalf("event %v, want a %s event", evs[0], what)
	}
	return ev
}

// trace is the one event the last runs reported, a trace event.
func (l *lxc) trace() *monitorapi.TraceEvent { return oneEvent[*monitorapi.TraceEvent](l, "trace") }

// drop is the one event the last runs reported, a drop event.
func (l *lxc) drop() *monitorapi.DropEvent { return oneEvent[*monitorapi.DropEvent](l, "drop") }

func (l *lxc) noEvents() {
	l.t.Helper()
	if evs := l.events(); len(evs) != 0 {
		l.t.Fatalf("events %v, want none", evs)
	}
}

// mapOf is the conntrack map of key's family and protocol.
func (l *lxc) mapOf(key any) *ebpf.Map {
	switch k := key.(type) {
	case ctmap.Key4:
		if k.Proto == unix.IPPROTO_TCP {
			return l.ct[ctmaps.MapTCP4]
		}
		return l.ct[ctmaps.MapAny4]
	case ctmap.Key6:
		if k.Proto == unix.IPPROTO_TCP {
			return l.ct[ctmaps.MapTCP6]
		}
		return l.ct[ctmaps.MapAny6]
	}
	panic("not a conntrack key")
}

// entry is key's entry; the test fails if there is none.
func (l *lxc) entry(key any) ctmap.Entry {
	l.t.Helper()
	var e ctmap.Entry
	if err := l.mapOf(key).Lookup(key, &e); err != nil {
		l.t.Fatalf("entry %v: %v", key, err)
	}
	return e
}

func (l *lxc) noEntry(key any) {
	l.t.Helper()
	var e ctmap.Entry
	err := l.mapOf(key).Lookup(key, &e)
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		l.t.Fatalf("entry %v: %v, %v; want none", key, e, err)
	}
}

// entries counts the entries of every conntrack map.
func (l *lxc) entries() int {
	l.t.Helper()
	n := 0
	for name, m := range l.ct {
		key := make([]byte, m.KeySize())
		val := make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(&key, &val) {
			n++
		}
		if err := it.Err(); err != nil {
			l.t.Fatalf("iterate %s: %v", name, err)
		}
	}
	return n
}

// lostEvents sums the lost counter over the CPUs.
func (l *lxc) lostEvents() uint64 {
	l.t.Helper()
	var perCPU []uint64
	if err := l.lost.Lookup(uint32(0), &perCPU); err != nil {
		l.t.Fatal(err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// window is the span of CLOCK_BOOTTIME seconds some runs happened in.
type window struct{ from, to uint32 }

func during(fn func()) window {
	from := ctmap.Now()
	fn()
	return window{from, ctmap.Now()}
}

// check checks that a time of an entry, got, is plus seconds after a time
// in w: an expiry with plus its lifetime, a last-seen time with plus 0.
func (w window) check(t *testing.T, what string, got, plus uint32) {
	t.Helper()
	if got < w.from+plus || got > w.to+plus {
		t.Fatalf("%s %d, want %d seconds after a time in [%d, %d]", what, got, plus, w.from, w.to)
	}
}

// Packets. Checksums stay 0: the programs do not check them.

func ethernet(etherType uint16, payload []byte) []byte {
	f := make([]byte, 14, 14+len(payload))
	copy(f[0:6], []byte{0x02, 0, 0, 0, 0, 0x01})
	copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 0x02})
	binary.BigEndian.PutUint16(f[12:], etherType)
	return append(f, payload...)
}

func ipv4Header(src, dst netip.Addr, proto uint8, payloadLen int) []byte {
	h := make([]byte, 20)
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+payloadLen))
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return h
}

func ipv6Header(src, dst netip.Addr, nextHeader uint8, payloadLen int) []byte {
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(payloadLen))
	h[6] = nextHeader
	h[7] = 64
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return h
}

// ipPacket is an Ethernet frame with an IP packet of src's family.
func ipPacket(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	if src.Is4() {
		return ethernet(unix.ETH_P_IP, append(ipv4Header(src, dst, proto, len(l4)), l4...))
	}
	return ethernet(unix.ETH_P_IPV6, append(ipv6Header(src, dst, proto, len(l4)), l4...))
}

func tcpHeader(sport, dport uint16, flags monitorapi.TCPFlags) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	h[12] = 5 << 4
	h[13] = uint8(flags)
	return h
}

func tcpPacket(src, dst netip.AddrPort, flags monitorapi.TCPFlags) []byte {
	return ipPacket(src.Addr(), dst.Addr(), unix.IPPROTO_TCP, tcpHeader(src.Port(), dst.Port(), flags))
}

func udpPacket(src, dst netip.AddrPort) []byte {
	h := make([]byte, 12)
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint16(h[4:], uint16(len(h)))
	copy(h[8:], "ping")
	return ipPacket(src.Addr(), dst.Addr(), unix.IPPROTO_UDP, h)
}

// icmpPacket is an ICMP (IPv4) or ICMPv6 (IPv6) message with the given
// type and an echo identifier.
func icmpPacket(src, dst netip.Addr, typ, code uint8, id uint16) []byte {
	h := make([]byte, 16)
	h[0], h[1] = typ, code
	binary.BigEndian.PutUint16(h[4:], id)
	binary.BigEndian.PutUint16(h[6:], 1)
	proto := uint8(unix.IPPROTO_ICMP)
	if src.Is6() {
		proto = unix.IPPROTO_ICMPV6
	}
	return ipPacket(src, dst, proto, h)
}

const (
	icmpEchoReply    = 0
	icmpUnreachable  = 3
	icmpEcho         = 8
	icmp6Echo        = 128
	icmp6EchoReply   = 129
	icmp6NeighSolict = 135
)

const (
	syn    = monitorapi.TCPSyn
	synAck = monitorapi.TCPSyn | monitorapi.TCPAck
	ack    = monitorapi.TCPAck
	finAck = monitorapi.TCPFin | monitorapi.TCPAck
	rstAck = monitorapi.TCPRst | monitorapi.TCPAck
)

// ctKey is the conntrack key of src's family.
func ctKey(proto uint8, src, dst netip.AddrPort, flags uint8) any {
	if src.Addr().Is4() {
		return ctmap.NewKey4(proto, src, dst, flags)
	}
	return ctmap.NewKey6(proto, src, dst, flags)
}

func tcpKey(src, dst netip.AddrPort, flags uint8) any {
	return ctKey(unix.IPPROTO_TCP, src, dst, flags)
}

// checkTrace checks a trace event's point, endpoint, conntrack state and
// tuple.
func checkTrace(t *testing.T, ev *monitorapi.TraceEvent, point monitorapi.TracePoint, endpoint uint16, state monitorapi.CTState, src, dst netip.AddrPort) {
	t.Helper()
	f := ev.Flow
	if ev.Point != point || ev.EndpointID != endpoint || f.CTState != state ||
		f.Src != src.Addr() || f.Dst != dst.Addr() || f.SrcPort != src.Port() || f.DstPort != dst.Port() {
		t.Fatalf("event %v; want %s, endpoint %d, ct=%s, %v -> %v", ev, point, endpoint, state, src, dst)
	}
}

// A same-node TCP connection from pod A to pod B, through A's from-endpoint
// and B's to-endpoint program and back, then closed with FINs both ways,
// and its tuple reused.
func TestLXCTCPConnection(t *testing.T) {
	for _, fam := range []struct {
		name string
		a, b netip.Addr
	}{{"IPv4", podA, podB}, {"IPv6", podA6, podB6}} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadLXC(t, lxcOptions{aggregation: true})
			a := netip.AddrPortFrom(fam.a, 40000)
			b := netip.AddrPortFrom(fam.b, 80)
			out := tcpKey(a, b, 0)                // A's from-endpoint entry
			in := tcpKey(a, b, ctmap.KeyIncoming) // B's to-endpoint entry
			synPkt := tcpPacket(a, b, syn)

			w := during(func() { l.run(l.from, synPkt, verdictNext) })
			ev := l.trace()
			checkTrace(t, ev, monitorapi.TraceFromEndpoint, epA, monitorapi.CTNew, a, b)
			if ev.Flow.TCPFlags != syn || ev.Flow.Len != uint32(len(synPkt)) || ev.IfIndex != l.devA || ev.Flow.Proto != unix.IPPROTO_TCP {
				t.Fatalf("event %v: want flags SYN, len %d, ifindex %d of A's interface", ev, len(synPkt), l.devA)
			}
			if d := time.Since(ev.Time); d < -time.Second || d > time.Minute {
				t.Fatalf("event time %v is not about now", ev.Time)
			}
			e := l.entry(out)
			if e.Flags != ctmap.CTFSynSeen || e.EndpointID != epA || e.PacketsTx != 1 || e.BytesTx != uint64(len(synPkt)) || e.PacketsRx != 0 {
				t.Fatalf("entry after SYN: %v", e)
			}
			w.check(t, "lifetime", e.Lifetime, lifetimeSyn)
			w.check(t, "last tx", e.LastTx, 0)

			l.run(l.to, synPkt, verdictNext)
			checkTrace(t, l.trace(), monitorapi.TraceToEndpoint, epB, monitorapi.CTNew, a, b)
			if e := l.entry(in); e.Flags != ctmap.CTFSynSeen || e.EndpointID != epB {
				t.Fatalf("B's entry after SYN: %v", e)
			}

			// The SYN-ACK: B's from-endpoint and A's to-endpoint find
			// their entries as replies.
			synAckPkt := tcpPacket(b, a, synAck)
			w = during(func() { l.run(l.from, synAckPkt, verdictNext) })
			checkTrace(t, l.trace(), monitorapi.TraceFromEndpoint, epB, monitorapi.CTReply, b, a)
			l.run(l.to, synAckPkt, verdictNext)
			checkTrace(t, l.trace(), monitorapi.TraceToEndpoint, epA, monitorapi.CTReply, b, a)
			established := ctmap.CTFSynSeen | ctmap.CTFEstablished | ctmap.CTFSeenReply
			for _, key := range []any{out, in} {
				e := l.entry(key)
				if e.Flags != established || e.PacketsTx != 1 || e.PacketsRx != 1 || e.BytesRx != uint64(len(synAckPkt)) {
					t.Fatalf("entry %v after SYN-ACK: %v", key, e)
				}
				w.check(t, "lifetime", e.Lifetime, lifetimeTCP)
				w.check(t, "last rx", e.LastRx, 0)
			}
			// Replies create nothing of their own.
			if n := l.entries(); n != 2 {
				t.Fatalf("%d entries, want the 2 of the connection", n)
			}

			ackPkt := tcpPacket(a, b, ack)
			l.run(l.from, ackPkt, verdictNext)
			if evs := l.events(); len(evs) > 1 || len(evs) == 1 && evs[0].(*monitorapi.TraceEvent).Flow.CTState != monitorapi.CTEstablished {
				t.Fatalf("events after ACK %v, want at most an established trace", evs)
			}
			if e := l.entry(out); e.PacketsTx != 2 || e.Flags != established {
				t.Fatalf("entry after ACK: %v", e)
			}

			// FIN from A half-closes; the FIN from B closes.
			w = during(func() {
				l.run(l.from, tcpPacket(a, b, finAck), verdictNext)
				l.run(l.to, tcpPacket(a, b, finAck), verdictNext)
			})
			for _, key := range []any{out, in} {
				e := l.entry(key)
				if e.Flags != established|ctmap.CTFTxClosing || e.State() != ctmap.StateHalfClosed {
					t.Fatalf("entry %v after A's FIN: %v", key, e)
				}
				w.check(t, "lifetime", e.Lifetime, lifetimeTCP)
			}
			w = during(func() {
				l.run(l.from, tcpPacket(b, a, finAck), verdictNext)
				l.run(l.to, tcpPacket(b, a, finAck), verdictNext)
			})
			for _, key := range []any{out, in} {
				e := l.entry(key)
				if e.Flags != established|ctmap.CTFTxClosing|ctmap.CTFRxClosing || e.State() != ctmap.StateClosing {
					t.Fatalf("entry %v after B's FIN: %v", key, e)
				}
				w.check(t, "lifetime", e.Lifetime, lifetimeClose)
			}
			l.events()

			// A new SYN on the closed tuple starts over.
			w = during(func() { l.run(l.from, synPkt, verdictNext) })
			checkTrace(t, l.trace(), monitorapi.TraceFromEndpoint, epA, monitorapi.CTNew, a, b)
			e = l.entry(out)
			if e.Flags != ctmap.CTFSynSeen || e.PacketsTx != 1 || e.PacketsRx != 0 {
				t.Fatalf("entry after a SYN on the closed connection: %v", e)
			}
			w.check(t, "lifetime", e.Lifetime, lifetimeSyn)

			// B opening a connection on the reversed tuple finds B's old
			// entry as a reply: it replaces it with one keyed its way.
			l.run(l.from, tcpPacket(b, a, syn), verdictNext)
			checkTrace(t, l.trace(), monitorapi.TraceFromEndpoint, epB, monitorapi.CTNew, b, a)
			l.noEntry(in)
			if e := l.entry(tcpKey(b, a, 0)); e.Flags != ctmap.CTFSynSeen || e.EndpointID != epB {
				t.Fatalf("B's new entry: %v", e)
			}
		})
	}
}

func TestLXCTCPReset(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true})
	a := netip.AddrPortFrom(podA, 40001)
	x := netip.AddrPortFrom(remote, 443)
	l.run(l.from, tcpPacket(a, x, syn), verdictNext)
	checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTNew, a, x)

	w := during(func() { l.run(l.to, tcpPacket(x, a, rstAck), verdictNext) })
	ev := l.trace()
	checkTrace(t, ev, monitorapi.TraceToEndpoint, epA, monitorapi.CTReply, x, a)
	if ev.Flow.TCPFlags != rstAck {
		t.Fatalf("event %v: want RST|ACK", ev)
	}
	e := l.entry(tcpKey(a, x, 0))
	if e.Flags&ctmap.CTFRstSeen == 0 || e.State() != ctmap.StateClosing {
		t.Fatalf("entry after RST: %v", e)
	}
	w.check(t, "lifetime", e.Lifetime, lifetimeClose)
}

// A TCP packet of a connection that has no entry (opened before the
// programs were attached) makes an established entry.
func TestLXCTCPMidstream(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true})
	a := netip.AddrPortFrom(podA, 40002)
	x := netip.AddrPortFrom(remote, 443)
	w := during(func() { l.run(l.from, tcpPacket(a, x, ack), verdictNext) })
	checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTNew, a, x)
	e := l.entry(tcpKey(a, x, 0))
	if e.Flags != ctmap.CTFEstablished {
		t.Fatalf("entry %v, want ESTABLISHED only", e)
	}
	w.check(t, "lifetime", e.Lifetime, lifetimeTCP)
}

func TestLXCUDP(t *testing.T) {
	for _, fam := range []struct {
		name string
		a, x netip.Addr
	}{{"IPv4", podA, remote}, {"IPv6", podA6, remote6}} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadLXC(t, lxcOptions{aggregation: true})
			a := netip.AddrPortFrom(fam.a, 5353)
			x := netip.AddrPortFrom(fam.x, 53)
			key := ctKey(unix.IPPROTO_UDP, a, x, 0)
			query := udpPacket(a, x)

			w := during(func() { l.run(l.from, query, verdictNext) })
			checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTNew, a, x)
			e := l.entry(key)
			if e.Flags != 0 || e.EndpointID != epA || e.PacketsTx != 1 || e.State() != ctmap.StateNew {
				t.Fatalf("entry after the query: %v", e)
			}
			w.check(t, "lifetime", e.Lifetime, lifetimeNonTCP)

			answer := udpPacket(x, a)
			w = during(func() { l.run(l.to, answer, verdictNext) })
			checkTrace(t, l.trace(), monitorapi.TraceToEndpoint, epA, monitorapi.CTReply, x, a)
			e = l.entry(key)
			if e.Flags != ctmap.CTFEstablished|ctmap.CTFSeenReply || e.PacketsRx != 1 || e.BytesRx != uint64(len(answer)) {
				t.Fatalf("entry after the answer: %v", e)
			}
			w.check(t, "lifetime", e.Lifetime, lifetimeNonTCP)
			if n := l.entries(); n != 1 {
				t.Fatalf("%d entries, want 1", n)
			}
		})
	}
}

func TestLXCICMP(t *testing.T) {
	for _, fam := range []struct {
		name                   string
		a, x                   netip.Addr
		proto                  uint8
		echo, reply, untracked uint8
	}{
		{"IPv4", podA, remote, unix.IPPROTO_ICMP, icmpEcho, icmpEchoReply, icmpUnreachable},
		{"IPv6", podA6, remote6, unix.IPPROTO_ICMPV6, icmp6Echo, icmp6EchoReply, icmp6NeighSolict},
	} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadLXC(t, lxcOptions{aggregation: true})
			const id = 0x1234
			// An echo's key: the identifier as source port, 0 as
			// destination port.
			req := netip.AddrPortFrom(fam.a, id)
			to := netip.AddrPortFrom(fam.x, 0)
			key := ctKey(fam.proto, req, to, 0)

			w := during(func() { l.run(l.from, icmpPacket(fam.a, fam.x, fam.echo, 0, id), verdictNext) })
			ev := l.trace()
			checkTrace(t, ev, monitorapi.TraceToStack, epA, monitorapi.CTNew, req, to)
			if ev.Flow.ICMPType != fam.echo || ev.Flow.Proto != monitorapi.Proto(fam.proto) {
				t.Fatalf("event %v: want %s type %d", ev, monitorapi.Proto(fam.proto), fam.echo)
			}
			e := l.entry(key)
			w.check(t, "lifetime", e.Lifetime, lifetimeNonTCP)

			// The reply carries the identifier as destination port.
			l.run(l.to, icmpPacket(fam.x, fam.a, fam.reply, 0, id), verdictNext)
			checkTrace(t, l.trace(), monitorapi.TraceToEndpoint, epA, monitorapi.CTReply, to, req)
			if e := l.entry(key); e.Flags != ctmap.CTFEstablished|ctmap.CTFSeenReply || e.PacketsRx != 1 {
				t.Fatalf("entry after the echo reply: %v", e)
			}

			// Other messages pass untracked, and each is reported.
			for range 2 {
				l.run(l.to, icmpPacket(fam.x, fam.a, fam.untracked, 1, 0), verdictNext)
				ev = l.trace()
				checkTrace(t, ev, monitorapi.TraceToEndpoint, epA, monitorapi.CTUnknown,
					netip.AddrPortFrom(fam.x, 0), netip.AddrPortFrom(fam.a, 0))
				if ev.Flow.ICMPType != fam.untracked || ev.Flow.ICMPCode != 1 {
					t.Fatalf("event %v: want type %d code 1", ev, fam.untracked)
				}
			}
			if n := l.entries(); n != 1 {
				t.Fatalf("%d entries, want the echo's only", n)
			}
		})
	}
}

// ip6Ext is an IPv6 extension header (hop-by-hop, routing, destination
// options) of 8*units bytes whose next header is nh.
func ip6Ext(nh uint8, units int) []byte {
	h := make([]byte, 8*units)
	h[0], h[1] = nh, uint8(units-1)
	return h
}

// ip6AH is an authentication header of 4*words bytes.
func ip6AH(nh uint8, words int) []byte {
	h := make([]byte, 4*words)
	h[0], h[1] = nh, uint8(words-2)
	return h
}

// ip6Frag is a fragment header: offset in 8-byte units, more fragments.
func ip6Frag(nh uint8, offset uint16, more bool, id uint32) []byte {
	h := make([]byte, 8)
	h[0] = nh
	fo := offset << 3
	if more {
		fo |= 1
	}
	binary.BigEndian.PutUint16(h[2:], fo)
	binary.BigEndian.PutUint32(h[4:], id)
	return h
}

// ip6With is an IPv6 frame whose payload is the extension headers hdrs,
// in order (the first's type is first), then l4, the transport header and
// data of a frame made by tcpPacket, udpPacket or icmpPacket.
func ip6With(src, dst netip.Addr, first uint8, l4 []byte, hdrs ...[]byte) []byte {
	payload := slices.Concat(append(hdrs, l4[14+40:])...)
	return ipPacket(src, dst, first, payload)
}

// IPv6 protocol numbers of the extension headers.
const (
	ip6Hop      = 0
	ip6Routing  = 43
	ip6Fragment = 44
	ip6Auth     = 51
	ip6Dest     = 60
)

// IPv6 extension headers are walked to the transport header: a first
// fragment and a packet behind hop-by-hop, destination options, routing and
// AH headers are tracked as their protocol, with their ports; a later
// fragment is reported untracked under its protocol; more than 8 extension
// headers, or one cut short, are invalid.
func TestLXCIPv6ExtensionHeaders(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: false})
	a := netip.AddrPortFrom(podA6, 5000)
	x := netip.AddrPortFrom(remote6, 53)

	first := ip6With(a.Addr(), x.Addr(), ip6Fragment, udpPacket(a, x), ip6Frag(unix.IPPROTO_UDP, 0, true, 42))
	l.run(l.from, first, verdictNext)
	ev := l.trace()
	checkTrace(t, ev, monitorapi.TraceToStack, epA, monitorapi.CTNew, a, x)
	if ev.Flow.Proto != unix.IPPROTO_UDP {
		t.Fatalf("first fragment traced %v, want UDP", ev)
	}
	l.entry(ctKey(unix.IPPROTO_UDP, a, x, 0))

	later := ip6With(a.Addr(), x.Addr(), ip6Fragment, udpPacket(a, x), ip6Frag(unix.IPPROTO_UDP, 185, false, 42))
	l.run(l.from, later, verdictNext)
	ev = l.trace()
	checkTrace(t, ev, monitorapi.TraceToStack, epA, monitorapi.CTUnknown, netip.AddrPortFrom(a.Addr(), 0), netip.AddrPortFrom(x.Addr(), 0))
	if ev.Flow.Proto != unix.IPPROTO_UDP {
		t.Fatalf("later fragment traced %v, want UDP", ev)
	}
	if e := l.entry(ctKey(unix.IPPROTO_UDP, a, x, 0)); e.PacketsTx != 1 {
		t.Fatalf("entry %v: want the first fragment counted only", e)
	}

	tcpA := netip.AddrPortFrom(podA6, 40000)
	tcpX := netip.AddrPortFrom(remote6, 443)
	chain := ip6With(tcpA.Addr(), tcpX.Addr(), ip6Hop, tcpPacket(tcpA, tcpX, syn),
		ip6Ext(ip6Dest, 1), ip6Ext(ip6Routing, 2), ip6Ext(ip6Auth, 3), ip6AH(ip6Fragment, 6), ip6Frag(ip6Dest, 0, false, 7), ip6Ext(unix.IPPROTO_TCP, 1))
	l.run(l.from, chain, verdictNext)
	ev = l.trace()
	checkTrace(t, ev, monitorapi.TraceToStack, epA, monitorapi.CTNew, tcpA, tcpX)
	if ev.Flow.Proto != unix.IPPROTO_TCP || ev.Flow.TCPFlags != syn {
		t.Fatalf("TCP behind 6 extension headers traced %v, want a TCP SYN", ev)
	}
	l.entry(tcpKey(tcpA, tcpX, 0))

	eight := make([][]byte, 8)
	for i := range eight {
		eight[i] = ip6Ext(ip6Dest, 1)
	}
	eight[7] = ip6Ext(unix.IPPROTO_UDP, 1)
	l.run(l.from, ip6With(a.Addr(), x.Addr(), ip6Dest, udpPacket(netip.AddrPortFrom(podA6, 5001), x), eight...), verdictNext)
	checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTNew, netip.AddrPortFrom(podA6, 5001), x)

	nine := append(slices.Clone(eight[:7]), ip6Ext(ip6Dest, 1), ip6Ext(unix.IPPROTO_UDP, 1))
	for _, tc := range []struct {
		name string
		pkt  []byte
	}{
		{"9 extension headers", ip6With(a.Addr(), x.Addr(), ip6Dest, udpPacket(a, x), nine...)},
		{"hop-by-hop longer than the packet", ipPacket(a.Addr(), x.Addr(), ip6Hop, ip6Ext(unix.IPPROTO_UDP, 1)[:8])},
		{"extension header cut short", ipPacket(a.Addr(), x.Addr(), ip6Dest, make([]byte, 4))},
		{"UDP cut short behind a fragment header", ipPacket(a.Addr(), x.Addr(), ip6Fragment, append(ip6Frag(unix.IPPROTO_UDP, 0, true, 9), 0, 53))},
	} {
		pkt := tc.pkt
		if tc.name == "hop-by-hop longer than the packet" {
			pkt[14+40+1] = 1 // says 16 bytes, 8 there: the UDP header is not
		}
		l.run(l.from, pkt, verdictDrop)
		if ev := l.drop(); ev.Reason != monitorapi.DropInvalidPacket {
			t.Fatalf("%s: %v, want an invalid-packet drop", tc.name, ev)
		}
	}
}

// A next header that is no extension header the programs walk and no
// transport they parse (here no next header) is tracked by addresses under
// its number.
func TestLXCIPv6OtherNextHeader(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true})
	const noNextHeader = 59
	w := during(func() { l.run(l.from, ipPacket(podA6, podB6, noNextHeader, make([]byte, 8)), verdictNext) })
	ev := l.trace()
	checkTrace(t, ev, monitorapi.TraceFromEndpoint, epA, monitorapi.CTNew, netip.AddrPortFrom(podA6, 0), netip.AddrPortFrom(podB6, 0))
	if ev.Flow.Proto != noNextHeader {
		t.Fatalf("event %v: want protocol %d", ev, noNextHeader)
	}
	e := l.entry(ctmap.NewKey6(noNextHeader, netip.AddrPortFrom(podA6, 0), netip.AddrPortFrom(podB6, 0), 0))
	w.check(t, "lifetime", e.Lifetime, lifetimeNonTCP)
}

// IPv4 fragments after the first have no transport header: they pass
// untracked; the first is tracked by its ports.
func TestLXCIPv4Fragments(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true})
	a := netip.AddrPortFrom(podA, 5000)
	x := netip.AddrPortFrom(remote, 6000)
	first := udpPacket(a, x)
	binary.BigEndian.PutUint16(first[14+6:], 0x2000) // more fragments, offset 0
	l.run(l.from, first, verdictNext)
	checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTNew, a, x)

	later := udpPacket(a, x)
	binary.BigEndian.PutUint16(later[14+6:], 185) // offset 1480 bytes, last
	l.run(l.from, later, verdictNext)
	checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTUnknown, netip.AddrPortFrom(podA, 0), netip.AddrPortFrom(remote, 0))
	if e := l.entry(ctmap.NewKey4(unix.IPPROTO_UDP, a, x, 0)); e.PacketsTx != 1 {
		t.Fatalf("entry %v: want the first fragment counted only", e)
	}
}

// What the from-endpoint program sees must come from an address of the
// endpoint whose interface it came in on: a source that is no endpoint's,
// another endpoint's, or an endpoint's own on an interface not its own is
// dropped with invalid-source, before conntrack (no entry), with endpoint 0.
// Into pod B, a source that is no endpoint's is B's connection as before.
func TestLXCInvalidSource(t *testing.T) {
	for _, fam := range []struct {
		name       string
		a, b, x    netip.Addr
		stranger   netip.Addr
		other      netip.Addr // A's address of the other family
		linkLocal  netip.Addr
		multicastB netip.Addr
	}{
		{"IPv4", podA, podB, remote, netip.MustParseAddr("10.244.0.99"), podA6, netip.Addr{}, netip.Addr{}},
		{"IPv6", podA6, podB6, remote6, netip.MustParseAddr("fd00:244::99"), podA, netip.MustParseAddr("fe80::2"), netip.MustParseAddr("ff02::1:ff00:3")},
	} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadLXC(t, lxcOptions{aggregation: true})
			x := netip.AddrPortFrom(fam.x, 80)
			for _, tc := range []struct {
				name    string
				src     netip.Addr
				ifindex uint32 // 0: lo, the interface of no endpoint
			}{
				{"no endpoint's source on A's interface", fam.stranger, l.devA},
				{"B's source on A's interface", fam.b, l.devA},
				{"A's source on B's interface", fam.a, l.devB},
				{"A's source on an interface of no endpoint", fam.a, 0},
			} {
				src := netip.AddrPortFrom(tc.src, 1234)
				for _, pkt := range [][]byte{tcpPacket(src, x, syn), udpPacket(src, x), icmpPacket(tc.src, fam.x, icmpEchoType(fam.a), 0, 7)} {
					l.runOn(tc.ifindex, &ebpf.RunOptions{Data: pkt}, l.from, verdictDrop)
					ev := l.drop()
					if ev.Reason != monitorapi.DropInvalidSource || ev.EndpointID != 0 || ev.Flow.Src != tc.src || ev.Flow.Dst != fam.x ||
						ev.Flow.CTState != monitorapi.CTUnknown || ev.IfIndex != l.lastIfIndex {
						t.Fatalf("%s: event %v, want an invalid-source drop of %v -> %v, endpoint 0, ct unknown, ifindex %d",
							tc.name, ev, tc.src, fam.x, l.lastIfIndex)
					}
				}
			}
			if n := l.entries(); n != 0 {
				t.Fatalf("%d entries after forged sources, want none", n)
			}

			// A's own addresses, of both families, on A's interface.
			for _, a := range []netip.Addr{fam.a, fam.other} {
				l.runOn(l.devA, &ebpf.RunOptions{Data: udpPacket(netip.AddrPortFrom(a, 1234), netip.AddrPortFrom(a, 53))}, l.from, verdictNext)
				if tr := l.trace(); tr.EndpointID != epA || tr.Flow.CTState != monitorapi.CTNew {
					t.Fatalf("A's packet from %v traced %v, want endpoint %d, ct=new", a, tr, epA)
				}
			}

			// Neighbour discovery from a link-local source, and ARP,
			// pass on A's interface.
			if fam.linkLocal.IsValid() {
				l.runOn(l.devA, &ebpf.RunOptions{Data: icmpPacket(fam.linkLocal, fam.multicastB, icmp6NeighSolict, 0, 0)}, l.from, verdictNext)
				if tr := l.trace(); tr.Flow.CTState != monitorapi.CTUnknown || tr.Flow.ICMPType != icmp6NeighSolict {
					t.Fatalf("neighbour solicitation traced %v, want untracked", tr)
				}
			}
			l.runOn(l.devA, &ebpf.RunOptions{Data: ethernet(unix.ETH_P_ARP, make([]byte, 28))}, l.from, verdictNext)
			l.noEvents()

			// Into pod B, a source that is no endpoint's: B's connection.
			stranger := netip.AddrPortFrom(fam.stranger, 1234)
			b := netip.AddrPortFrom(fam.b, 80)
			l.run(l.to, tcpPacket(stranger, b, syn), verdictNext)
			checkTrace(t, l.trace(), monitorapi.TraceToEndpoint, epB, monitorapi.CTNew, stranger, b)
		})
	}
}

// icmpEchoType is the echo request type of a's family.
func icmpEchoType(a netip.Addr) uint8 {
	if a.Is4() {
		return icmpEcho
	}
	return icmp6Echo
}

// With aggregation, a packet that changes nothing in the second of the
// previous one of its direction is not reported; without, every packet is.
func TestLXCAggregation(t *testing.T) {
	for _, tc := range []struct {
		aggregation bool
		want        int // events of the repeated query
	}{{true, 0}, {false, 1}} {
		l := loadLXC(t, lxcOptions{aggregation: tc.aggregation})
		// The two queries must fall into one second: try again, on a
		// new connection, when a second boundary fell between them.
		for port := uint16(1000); ; port++ {
			if port == 1010 {
				t.Fatal("no two packets in one second in 10 tries")
			}
			a := netip.AddrPortFrom(podA, port)
			x := netip.AddrPortFrom(remote, 53)
			var first, second, reply []monitorapi.Event
			w := during(func() {
				l.run(l.from, udpPacket(a, x), verdictNext)
				first = l.events()
				l.run(l.from, udpPacket(a, x), verdictNext)
				second = l.events()
				// The first reply changes the entry's flags.
				l.run(l.to, udpPacket(x, a), verdictNext)
				reply = l.events()
			})
			if w.from != w.to {
				continue
			}
			if len(first) != 1 || len(second) != tc.want || len(reply) != 1 {
				t.Fatalf("aggregation %v: %d, %d, %d events for a new query, a repeated one and a reply; want 1, %d, 1",
					tc.aggregation, len(first), len(second), len(reply), tc.want)
			}
			if e := l.entry(ctmap.NewKey4(unix.IPPROTO_UDP, a, x, 0)); e.PacketsTx != 2 {
				t.Fatalf("entry %v: want both queries counted", e)
			}
			break
		}
	}
}

func TestLXCDrops(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true})
	a := netip.AddrPortFrom(podA, 40000)
	x := netip.AddrPortFrom(remote, 80)
	good := tcpPacket(a, x, syn)
	edit := func(pkt []byte, fn func([]byte)) []byte {
		pkt = slices.Clone(pkt)
		fn(pkt)
		return pkt
	}
	ip4 := func(src, dst netip.Addr, proto uint8, l4 []byte) []byte { return ipPacket(src, dst, proto, l4) }

	for _, tc := range []struct {
		name   string
		pkt    []byte
		reason monitorapi.DropReason
		// parsed: the addresses were read before the drop.
		parsed bool
	}{
		// (BPF_PROG_TEST_RUN itself refuses IPv4 and IPv6 packets shorter
		// than their fixed header.)
		{"IPv4 header longer than the packet", edit(good, func(p []byte) { p[14] = 0x4f }), monitorapi.DropInvalidPacket, false},
		{"IPv4 header length 4", edit(good, func(p []byte) { p[14] = 0x44 }), monitorapi.DropInvalidPacket, false},
		{"IPv4 version 5", edit(good, func(p []byte) { p[14] = 0x55 }), monitorapi.DropInvalidPacket, false},
		{"IPv4 total length beyond the packet", edit(good, func(p []byte) { binary.BigEndian.PutUint16(p[16:], 41) }), monitorapi.DropInvalidPacket, false},
		{"IPv4 total length 0", edit(good, func(p []byte) { binary.BigEndian.PutUint16(p[16:], 0) }), monitorapi.DropInvalidPacket, false},
		{"TCP header cut short", ip4(podA, remote, unix.IPPROTO_TCP, make([]byte, 10)), monitorapi.DropInvalidPacket, true},
		{"TCP data offset 4", edit(good, func(p []byte) { p[14+20+12] = 4 << 4 }), monitorapi.DropInvalidPacket, true},
		{"TCP options beyond the packet", edit(good, func(p []byte) { p[14+20+12] = 6 << 4 }), monitorapi.DropInvalidPacket, true},
		{"UDP header cut short", ip4(podA, remote, unix.IPPROTO_UDP, make([]byte, 6)), monitorapi.DropInvalidPacket, true},
		{"ICMP header cut short", ip4(podA, remote, unix.IPPROTO_ICMP, make([]byte, 4)), monitorapi.DropInvalidPacket, true},
		{"IPv6 payload length 0", edit(tcpPacket(netip.AddrPortFrom(podA6, 1), netip.AddrPortFrom(remote6, 2), syn),
			func(p []byte) { binary.BigEndian.PutUint16(p[14+4:], 0) }), monitorapi.DropInvalidPacket, false},
		{"IPv6 payload beyond the packet", edit(tcpPacket(netip.AddrPortFrom(podA6, 1), netip.AddrPortFrom(remote6, 2), syn),
			func(p []byte) { binary.BigEndian.PutUint16(p[14+4:], 21) }), monitorapi.DropInvalidPacket, false},
		{"IPv6 version 4", edit(tcpPacket(netip.AddrPortFrom(podA6, 1), netip.AddrPortFrom(remote6, 2), syn),
			func(p []byte) { p[14] = 0x40 }), monitorapi.DropInvalidPacket, false},
		{"LLDP", ethernet(0x88cc, make([]byte, 46)), monitorapi.DropUnsupportedL3, false},
		{"VLAN tag", ethernet(unix.ETH_P_8021Q, make([]byte, 46)), monitorapi.DropUnsupportedL3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := l.on(t)
			for _, prog := range []*ebpf.Program{l.from, l.to} {
				l.run(prog, tc.pkt, verdictDrop)
				ev := l.drop()
				if ev.Reason != tc.reason || ev.Flow.CTState != monitorapi.CTUnknown || ev.Flow.Len != uint32(len(tc.pkt)) || ev.IfIndex != l.lastIfIndex {
					t.Fatalf("event %v; want reason %s, ct unknown, len %d, ifindex %d", ev, tc.reason, len(tc.pkt), l.lastIfIndex)
				}
				if tc.parsed != ev.Flow.Src.IsValid() {
					t.Fatalf("event %v: addresses read %v, want %v", ev, ev.Flow.Src.IsValid(), tc.parsed)
				}
				if tc.parsed && (ev.Flow.Src != podA || ev.Flow.Dst != remote || ev.EndpointID != epA && prog == l.from) {
					t.Fatalf("event %v: want %v -> %v from endpoint %d", ev, podA, remote, epA)
				}
			}
		})
	}
	if n := l.entries(); n != 0 {
		t.Fatalf("%d entries after dropped packets, want none", n)
	}
}

// ARP passes both ways, unreported and untracked.
func TestLXCARP(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: false})
	arp := ethernet(unix.ETH_P_ARP, make([]byte, 28))
	l.run(l.from, arp, verdictNext)
	l.run(l.to, arp, verdictNext)
	l.noEvents()
	if n := l.entries(); n != 0 {
		t.Fatalf("%d entries after ARP, want none", n)
	}
}

// An entry the map refuses drops the packet. The conntrack maps are LRU
// maps, which make room instead; the test loads a plain hash of one entry in
// place of one.
func TestLXCCTCreateFailed(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true, edit: func(spec *ebpf.CollectionSpec) {
		m := spec.Maps[ctmaps.MapAny4]
		m.Type, m.MaxEntries = ebpf.Hash, 1
	}})
	a := netip.AddrPortFrom(podA, 5000)
	x := netip.AddrPortFrom(remote, 53)
	l.run(l.from, udpPacket(a, x), verdictNext)
	l.events()
	other := netip.AddrPortFrom(remote, 54)
	l.run(l.from, udpPacket(a, other), verdictDrop)
	ev := l.drop()
	if ev.Reason != monitorapi.DropCTCreateFailed || ev.Flow.Dst != other.Addr() || ev.Flow.DstPort != other.Port() || ev.EndpointID != epA {
		t.Fatalf("event %v; want a ct-create-failed drop of %v -> %v", ev, a, other)
	}
	// The known connection still passes.
	l.run(l.from, udpPacket(a, x), verdictNext)
}

// The size of struct __sk_buff and the offset of its ifindex, which
// TestLXCSkbLayout checks against the BTF of the compiled object.
const (
	skbSize          = 192
	skbIfIndexOffset = 40
)

// TestLXCSkbLayout: withIfIndex's offsets are the BTF's.
func TestLXCSkbLayout(t *testing.T) {
	ctx := skbContext(t, map[string]uint32{"ifindex": 7})
	if len(ctx) != skbSize || binary.NativeEndian.Uint32(ctx[skbIfIndexOffset:]) != 7 {
		t.Fatalf("struct __sk_buff is %d bytes with ifindex at %d, want %d and %d", len(ctx), slices.Index(ctx, 7), skbSize, skbIfIndexOffset)
	}
}

// skbContext is a struct __sk_buff for BPF_PROG_TEST_RUN with the given
// fields set, laid out by the BTF of the compiled object.
func skbContext(t *testing.T, fields map[string]uint32) []byte {
	t.Helper()
	spec, err := bpf.LoadLXC()
	if err != nil {
		t.Fatal(err)
	}
	var skb *btf.Struct
	if err := spec.Types.TypeByName("__sk_buff", &skb); err != nil {
		t.Fatal(err)
	}
	ctx := make([]byte, skb.Size)
	for name, v := range fields {
		i := slices.IndexFunc(skb.Members, func(m btf.Member) bool { return m.Name == name })
		if i < 0 {
			t.Fatalf("__sk_buff has no field %s", name)
		}
		binary.NativeEndian.PutUint32(ctx[skb.Members[i].Offset.Bytes():], v)
	}
	return ctx
}

// A BIG TCP aggregate has IP length 0, and the real length in the skb: it
// passes tracked when the skb says it is GSO, and is dropped otherwise.
func TestLXCBigTCP(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true})
	for _, fam := range []struct {
		a, x     netip.Addr
		lenField int
	}{{podA, remote, 14 + 2}, {podA6, remote6, 14 + 4}} {
		a := netip.AddrPortFrom(fam.a, 40000)
		x := netip.AddrPortFrom(fam.x, 80)
		pkt := tcpPacket(a, x, ack)
		binary.BigEndian.PutUint16(pkt[fam.lenField:], 0)

		l.run(l.from, pkt, verdictDrop)
		if ev := l.drop(); ev.Reason != monitorapi.DropInvalidPacket {
			t.Fatalf("event %v: want invalid-packet without GSO", ev)
		}
		gso := &ebpf.RunOptions{Data: pkt, Context: skbContext(t, map[string]uint32{"gso_size": 1448, "gso_segs": 1})}
		l.runWith(gso, l.from, verdictNext)
		checkTrace(t, l.trace(), monitorapi.TraceToStack, epA, monitorapi.CTNew, a, x)
		if e := l.entry(tcpKey(a, x, 0)); e.BytesTx != uint64(len(pkt)) {
			t.Fatalf("entry %v: want %d bytes", e, len(pkt))
		}
	}
}

// A full ring buffer loses records, and the lost counter counts each.
func TestLXCLostEvents(t *testing.T) {
	l := loadLXC(t, lxcOptions{aggregation: true, ringSize: uint32(os.Getpagesize())})
	// Untracked packets are reported every time.
	pkt := icmpPacket(remote, podA, icmpUnreachable, 1, 0)
	const runs = 200
	for range runs {
		l.run(l.to, pkt, verdictNext)
	}
	read := len(l.events())
	lost := l.lostEvents()
	t.Logf("a ring buffer of %d bytes took %d of %d records, lost %d", os.Getpagesize(), read, runs, lost)
	if lost == 0 || read+int(lost) != runs {
		t.Fatalf("%d records read, %d lost; want some lost and %d in all", read, lost, runs)
	}
	// Room again after reading.
	l.run(l.to, pkt, verdictNext)
	l.trace()
	if n := l.lostEvents(); n != lost {
		t.Fatalf("lost %d after reading, want still %d", n, lost)
	}
}

// TestLXCLayoutsMatchBTF compares the Go mirrors of the conntrack and
// endpoint maps with the BTF of their C types in lxc.c (see
// bpftest.CompareLayout).
func TestLXCLayoutsMatchBTF(t *testing.T) {
	spec, err := bpf.LoadLXC()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		name       string
		key, value reflect.Type
	}{
		{ctmaps.MapTCP4, reflect.TypeFor[ctmap.Key4](), reflect.TypeFor[ctmap.Entry]()},
		{ctmaps.MapAny4, reflect.TypeFor[ctmap.Key4](), reflect.TypeFor[ctmap.Entry]()},
		{ctmaps.MapTCP6, reflect.TypeFor[ctmap.Key6](), reflect.TypeFor[ctmap.Entry]()},
		{ctmaps.MapAny6, reflect.TypeFor[ctmap.Key6](), reflect.TypeFor[ctmap.Entry]()},
		{bpf.LXCMapCelliumEndpoints, reflect.TypeFor[endpointmaps.EndpointKey](), reflect.TypeFor[endpointmaps.EndpointInfo]()},
		{ctmaps.MapEventsLost, reflect.TypeFor[uint32](), reflect.TypeFor[uint64]()},
		{ipcachemap.MapName, reflect.TypeFor[ipcachemap.Key](), reflect.TypeFor[ipcachemap.Value]()},
		{policymap.MapName, reflect.TypeFor[policymap.Key](), reflect.TypeFor[policymap.Value]()},
		{policymap.EnforcementMapName, reflect.TypeFor[uint32](), reflect.TypeFor[policymap.Enforcement]()},
		{policymap.PrefixMapName, reflect.TypeFor[policymap.PrefixKey](), reflect.TypeFor[policymap.PrefixValue]()},
	} {
		m, ok := spec.Maps[l.name]
		if !ok {
			t.Errorf("the object has no map %s", l.name)
			continue
		}
		bpftest.CompareMap(t, l.name, m, l.key, l.value)
	}
	if m := spec.Maps[ctmaps.MapEvents]; m == nil || m.Type != ebpf.RingBuf {
		t.Errorf("map %s is %v, want a ring buffer", ctmaps.MapEvents, m)
	}
}

// TestLXCIdentities: trace events carry the identities of the longest
// ipcache prefixes that hold the source and the destination, 0 where no
// prefix does.
func TestLXCIdentities(t *testing.T) {
	l := loadLXC(t, lxcOptions{})
	put := func(prefix string, id uint32) {
		t.Helper()
		if err := l.ipcache.Put(ipcachemap.KeyOf(netip.MustParsePrefix(prefix)), ipcachemap.Value{Identity: id}); err != nil {
			t.Fatalf("put %s: %v", prefix, err)
		}
	}
	put("10.244.0.0/24", 2000)
	put(podA.String()+"/32", 1000)
	put("0.0.0.0/0", 2)
	put(podA6.String()+"/128", 1000)

	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
		want     [2]uint32
	}{
		{"pod to pod: /32 and the /24", podA, podB, [2]uint32{1000, 2000}},
		{"pod to outside: world", podA, remote, [2]uint32{1000, 2}},
		{"IPv6 without a default: 0", podA6, podB6, [2]uint32{1000, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := l.on(t)
			l.run(l.from, udpPacket(netip.AddrPortFrom(tc.src, 5000), netip.AddrPortFrom(tc.dst, 53)), verdictNext)
			ev := l.trace()
			if got := [2]uint32{ev.Flow.SrcIdentity, ev.Flow.DstIdentity}; got != tc.want {
				t.Fatalf("identities %v, want %v", got, tc.want)
			}
		})
	}
}
