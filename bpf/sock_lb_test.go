package bpf_test

import (
	"maps"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/cells/lbmaps"
	"github.com/cellium/cellium/cells/loader/socklbtest"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// The sock_lb tests run clients through the programs with the harness of
// cells/loader/socklbtest: the loader attaches the programs to a cgroup of
// the test's own, the test fills the maps by hand, clients in that cgroup
// and a network namespace with only lo connect to service addresses, and
// backends on loopback addresses say who they are.
func TestMain(m *testing.M) { socklbtest.Main(m) }

var (
	svc4       = netip.MustParseAddr("10.96.0.10")
	nodeAddr4  = netip.MustParseAddr("10.244.0.1")
	backends4  = addrPorts("127.0.0.2:8080", "127.0.0.3:8080", "127.0.0.4:8080")
	svc6       = netip.MustParseAddr("fd00:96::10")
	backends6  = addrPorts("[fd00:10::1]:8080", "[fd00:10::2]:8080", "[fd00:10::3]:8080")
	nodeAddr6  = netip.MustParseAddr("fd00:244::1")
	wildcard4  = netip.IPv4Unspecified()
	wildcard6  = netip.IPv6Unspecified()
	loopback4  = netip.MustParseAddr("127.0.0.1")
	loopback6  = netip.IPv6Loopback()
	serviceTCP = netip.AddrPortFrom(svc4, 80)
)

func addrPorts(s ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddrPort(a)
	}
	return out
}

// service is what a test puts into the maps for one frontend.
type service struct {
	frontend netip.AddrPort
	proto    lbmap.Proto
	revNAT   lbmap.RevNATIndex
	flags    lbmap.ServiceFlags
	affinity time.Duration
	// slots are the backend IDs of slots 1..n.
	slots []lbmap.BackendID
}

// put writes the master entry, the slots and the reverse NAT entry, in the
// maps of the frontend's family.
func (s service) put(t *testing.T, m *lbmaps.Maps) {
	t.Helper()
	fe := s.frontend.Addr()
	master := lbmap.NewServiceMaster(uint16(len(s.slots)), s.revNAT, s.flags, s.affinity)
	var err error
	if fe.Is4() {
		err = m.Services4.Put(lbmap.NewService4Key(fe, s.frontend.Port(), s.proto, 0), master)
		for i, id := range s.slots {
			if err == nil {
				err = m.Services4.Put(lbmap.NewService4Key(fe, s.frontend.Port(), s.proto, uint16(i+1)), lbmap.NewServiceSlot(id, s.revNAT))
			}
		}
		if err == nil {
			err = m.RevNAT4.Put(s.revNAT, lbmap.NewRevNAT4(fe, s.frontend.Port()))
		}
	} else {
		err = m.Services6.Put(lbmap.NewService6Key(fe, s.frontend.Port(), s.proto, 0), master)
		for i, id := range s.slots {
			if err == nil {
				err = m.Services6.Put(lbmap.NewService6Key(fe, s.frontend.Port(), s.proto, uint16(i+1)), lbmap.NewServiceSlot(id, s.revNAT))
			}
		}
		if err == nil {
			err = m.RevNAT6.Put(s.revNAT, lbmap.NewRevNAT6(fe, s.frontend.Port()))
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// putBackends gives the backends IDs first, first+1, ... and returns them.
func putBackends(t *testing.T, m *lbmaps.Maps, proto lbmap.Proto, first lbmap.BackendID, bes ...netip.AddrPort) []lbmap.BackendID {
	t.Helper()
	var ids []lbmap.BackendID
	for i, be := range bes {
		id := first + lbmap.BackendID(i)
		var err error
		if be.Addr().Is4() {
			err = m.Backends4.Put(id, lbmap.NewBackend4(be.Addr(), be.Port(), proto))
		} else {
			err = m.Backends6.Put(id, lbmap.NewBackend6(be.Addr(), be.Port(), proto))
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// reached counts the results per backend, and fails the test on a result
// that reached none.
func reached(t *testing.T, results []socklbtest.Result) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, r := range results {
		if r.Errno != "" || r.Backend == "" {
			t.Fatalf("want a backend: %v", r)
		}
		counts[r.Backend]++
	}
	return counts
}

func only(t *testing.T, results []socklbtest.Result, backend netip.AddrPort) {
	t.Helper()
	if got := reached(t, results); len(got) != 1 || got[backend.String()] != len(results) {
		t.Fatalf("backends reached %v, want only %s", got, backend)
	}
}

func wantErrno(t *testing.T, r socklbtest.Result, failed, errno string) {
	t.Helper()
	if r.Failed != failed || r.Errno != errno || r.Backend != "" {
		t.Fatalf("%v; want %s to fail with %s", r, failed, errno)
	}
}

func TestConnectTCP(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.ServeTCP(backends4...)
	ids := putBackends(t, m, lbmap.TCP, 1, backends4...)
	service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 1, slots: ids}.put(t, m)

	r := env.Run(socklbtest.Call{Op: socklbtest.TCP, To: serviceTCP})[0]
	if !slices.Contains(backends4, netip.MustParseAddrPort(r.Backend)) {
		t.Fatalf("%v: want one of the backends %v", r, backends4)
	}
	// The socket is connected to the backend, but its peer is the service.
	if r.Peer != serviceTCP {
		t.Fatalf("getpeername = %v, want the service address %v", r.Peer, serviceTCP)
	}
}

func TestConnectSpreadsOverBackends(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.ServeTCP(backends4...)
	ids := putBackends(t, m, lbmap.TCP, 1, backends4...)
	service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 1, slots: ids}.put(t, m)

	// Random slots: the chance that 60 connects miss one of 3 backends is
	// 3*(2/3)^60, about 1e-10.
	counts := reached(t, env.Run(socklbtest.Repeat(60, socklbtest.Call{Op: socklbtest.TCP, To: serviceTCP})...))
	t.Logf("60 connects per backend: %v", counts)
	for _, be := range backends4 {
		if counts[be.String()] == 0 {
			t.Fatalf("backend %s never reached: %v", be, counts)
		}
	}
}

func TestMaglev(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.ServeTCP(backends4...)
	ids := putBackends(t, m, lbmap.TCP, 1, backends4...)
	call := socklbtest.Call{Op: socklbtest.TCP, To: serviceTCP}
	// The slots name only the first backend: whatever else is reached came
	// from the Maglev table.
	svc := service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 1, flags: lbmap.ServiceMaglev, slots: ids[:1]}
	svc.put(t, m)

	// No table yet (the control plane writes it after the service): the
	// random slot still serves.
	only(t, env.Run(socklbtest.Repeat(5, call)...), backends4[0])

	table := make([]lbmap.BackendID, m.Maglev4.TableSize())
	for i := range table {
		table[i] = ids[1]
	}
	if err := m.Maglev4.Put(svc.revNAT, table); err != nil {
		t.Fatal(err)
	}
	only(t, env.Run(socklbtest.Repeat(10, call)...), backends4[1])

	// Each socket hashes to its own slot: a table that alternates two
	// backends sends sockets to both.
	for i := range table {
		table[i] = ids[1+i%2]
	}
	if err := m.Maglev4.Put(svc.revNAT, table); err != nil {
		t.Fatal(err)
	}
	counts := reached(t, env.Run(socklbtest.Repeat(40, call)...))
	t.Logf("40 connects over a table of two backends: %v", counts)
	if len(counts) != 2 || counts[backends4[1].String()] == 0 || counts[backends4[2].String()] == 0 {
		t.Fatalf("backends reached %v, want both of the table's", counts)
	}
}

// bootSeconds is the clock of lb_affinity_val.last_used.
func bootSeconds(t *testing.T) uint32 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	return uint32(ts.Sec)
}

func TestAffinity(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.ServeTCP(backends4...)
	ids := putBackends(t, m, lbmap.TCP, 1, backends4...)
	call := socklbtest.Call{Op: socklbtest.TCP, To: serviceTCP}
	const timeout = 60 * time.Second
	svc := service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 1, flags: lbmap.ServiceAffinity, affinity: timeout, slots: ids}
	svc.put(t, m)

	// One client (one network namespace) stays on one backend.
	counts := reached(t, env.Run(socklbtest.Repeat(20, call)...))
	if len(counts) != 1 {
		t.Fatalf("one client reached %v, want a single backend", counts)
	}
	entries := map[lbmap.AffinityKey]lbmap.AffinityValue{}
	if err := m.Affinity.Iterate(func(k lbmap.AffinityKey, v lbmap.AffinityValue) bool { entries[k] = v; return true }); err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("affinity entries %v, want one", entries)
	}
	key := slices.Collect(maps.Keys(entries))[0]
	first := entries[key]
	if key.RevNATIndex != svc.revNAT || key.NetNSCookie == 0 {
		t.Fatalf("affinity key %v, want the client's netns and revnat %d", key, svc.revNAT)
	}
	if _, ok := counts[backends4[first.BackendID-1].String()]; !ok {
		t.Fatalf("affinity entry %v does not name the backend reached, %v", first, counts)
	}

	// From here the slots name only the first backend; the affinity entry
	// decides whether a client goes elsewhere.
	svc.slots = ids[:1]
	svc.put(t, m)
	setAffinity := func(backend lbmap.BackendID, lastUsed uint32) {
		t.Helper()
		if err := m.Affinity.Put(key, lbmap.AffinityValue{BackendID: backend, LastUsed: lastUsed}); err != nil {
			t.Fatal(err)
		}
	}

	// A fresh entry wins over selection, and is refreshed on use.
	setAffinity(ids[2], bootSeconds(t)-10)
	only(t, env.Run(socklbtest.Repeat(5, call)...), backends4[2])
	if v, err := m.Affinity.Lookup(key); err != nil || v.BackendID != ids[2] || v.LastUsed < bootSeconds(t)-1 {
		t.Fatalf("affinity after use = %v, %v; want backend %d used just now", v, err, ids[2])
	}

	// An entry older than the timeout is replaced by a new choice.
	setAffinity(ids[2], bootSeconds(t)-uint32(timeout/time.Second)-1)
	only(t, env.Run(call), backends4[0])
	if v, err := m.Affinity.Lookup(key); err != nil || v.BackendID != ids[0] || v.LastUsed < bootSeconds(t)-1 {
		t.Fatalf("affinity after expiry = %v, %v; want the new backend %d, used just now", v, err, ids[0])
	}

	// An entry whose backend is gone is replaced too.
	setAffinity(ids[2], bootSeconds(t))
	if err := m.Backends4.Delete(ids[2]); err != nil {
		t.Fatal(err)
	}
	only(t, env.Run(call), backends4[0])
}

func TestNoBackendsRefuses(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 1}.put(t, m)
	dns := netip.AddrPortFrom(svc4, 53)
	service{frontend: dns, proto: lbmap.UDP, revNAT: 2}.put(t, m)
	// A slot whose backend is not in the backend map.
	broken := netip.AddrPortFrom(svc4, 81)
	service{frontend: broken, proto: lbmap.TCP, revNAT: 3, slots: []lbmap.BackendID{99}}.put(t, m)

	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: serviceTCP},
		socklbtest.Call{Op: socklbtest.UDPConnected, To: dns},
		socklbtest.Call{Op: socklbtest.UDP, To: dns},
		socklbtest.Call{Op: socklbtest.TCP, To: broken},
	)
	// ECONNREFUSED, what a client expects of a service that cannot take
	// it, and not the EPERM of a plain program rejection.
	wantErrno(t, r[0], "connect", "ECONNREFUSED")
	wantErrno(t, r[1], "connect", "ECONNREFUSED")
	wantErrno(t, r[2], "send", "ECONNREFUSED")
	wantErrno(t, r[3], "connect", "ECONNREFUSED")
}

func TestNoServiceUntouched(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.ServeTCP(backends4[0])
	ids := putBackends(t, m, lbmap.TCP, 1, backends4[0])
	service{frontend: netip.AddrPortFrom(svc4, 53), proto: lbmap.UDP, revNAT: 1, slots: ids}.put(t, m)

	// The test netns has no route to the service range: an untranslated
	// connect fails there, and nowhere else.
	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(svc4, 80)}, // no such port
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(svc4, 53)}, // a UDP service
		socklbtest.Call{Op: socklbtest.TCP, To: netip.MustParseAddrPort("10.96.0.11:53")},
		// A backend reached directly stays as it is, getpeername too.
		socklbtest.Call{Op: socklbtest.TCP, To: backends4[0]},
	)
	for _, res := range r[:3] {
		wantErrno(t, res, "connect", "ENETUNREACH")
	}
	if r[3].Backend != backends4[0].String() || r[3].Peer != backends4[0] {
		t.Fatalf("%v; want the backend itself as backend and peer", r[3])
	}
}

func TestUDP(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.ServeUDP(backends4...)
	dns := netip.AddrPortFrom(svc4, 53)
	ids := putBackends(t, m, lbmap.UDP, 1, backends4...)
	service{frontend: dns, proto: lbmap.UDP, revNAT: 1, slots: ids}.put(t, m)

	for _, r := range env.Run(
		socklbtest.Call{Op: socklbtest.UDP, To: dns},
		socklbtest.Call{Op: socklbtest.UDPConnected, To: dns},
	) {
		if !slices.Contains(backends4, netip.MustParseAddrPort(r.Backend)) {
			t.Fatalf("%v: want an answer from a backend", r)
		}
		// The reply came from the backend; recvmsg shows the service.
		if r.From != dns {
			t.Fatalf("%v: reply from %v, want the service address %v", r, r.From, dns)
		}
		if r.Call.Op == socklbtest.UDPConnected && r.Peer != dns {
			t.Fatalf("%v: getpeername %v, want %v", r, r.Peer, dns)
		}
	}
}

func TestNodePort(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	env.AddAddr(netip.PrefixFrom(nodeAddr4, 32))
	env.ServeTCP(backends4[0])
	ids := putBackends(t, m, lbmap.TCP, 1, backends4[0])
	service{frontend: netip.AddrPortFrom(nodeAddr4, 30080), proto: lbmap.TCP, revNAT: 1, slots: ids}.put(t, m)
	service{frontend: netip.AddrPortFrom(wildcard4, 30081), proto: lbmap.TCP, revNAT: 2, flags: lbmap.ServiceNodePortWildcard, slots: ids}.put(t, m)
	// A wildcard entry without the flag does not answer on loopback.
	service{frontend: netip.AddrPortFrom(wildcard4, 30082), proto: lbmap.TCP, revNAT: 3, slots: ids}.put(t, m)

	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(nodeAddr4, 30080)},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(loopback4, 30081)},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.MustParseAddrPort("127.0.0.9:30081")},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(loopback4, 30082)},
		// The wildcard answers on loopback only; the node address has no
		// listener on that port.
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(nodeAddr4, 30081)},
	)
	for _, res := range r[:3] {
		if res.Backend != backends4[0].String() || res.Peer != res.Call.To {
			t.Fatalf("%v; want backend %s and the address connected to as peer", res, backends4[0])
		}
	}
	// Untouched: nothing listens on those ports.
	wantErrno(t, r[3], "connect", "ECONNREFUSED")
	wantErrno(t, r[4], "connect", "ECONNREFUSED")
}

func TestIPv6(t *testing.T) {
	env := socklbtest.New(t)
	env.RequireIPv6()
	m := env.StartDatapath()
	for _, be := range backends6 {
		env.AddAddr(netip.PrefixFrom(be.Addr(), 128))
	}
	env.AddAddr(netip.PrefixFrom(nodeAddr6, 128))
	env.ServeTCP(backends6...)
	env.ServeUDP(backends6...)
	tcpIDs := putBackends(t, m, lbmap.TCP, 1, backends6...)
	udpIDs := putBackends(t, m, lbmap.UDP, 11, backends6...)
	web := netip.AddrPortFrom(svc6, 80)
	dns := netip.AddrPortFrom(svc6, 53)
	service{frontend: web, proto: lbmap.TCP, revNAT: 1, slots: tcpIDs}.put(t, m)
	service{frontend: dns, proto: lbmap.UDP, revNAT: 2, slots: udpIDs}.put(t, m)
	empty := netip.AddrPortFrom(svc6, 81)
	service{frontend: empty, proto: lbmap.TCP, revNAT: 3}.put(t, m)
	service{frontend: netip.AddrPortFrom(nodeAddr6, 30080), proto: lbmap.TCP, revNAT: 4, slots: tcpIDs[:1]}.put(t, m)
	service{frontend: netip.AddrPortFrom(wildcard6, 30081), proto: lbmap.TCP, revNAT: 5, flags: lbmap.ServiceNodePortWildcard, slots: tcpIDs[:1]}.put(t, m)
	maglev := netip.AddrPortFrom(svc6, 82)
	service{frontend: maglev, proto: lbmap.TCP, revNAT: 6, flags: lbmap.ServiceMaglev, slots: tcpIDs[:1]}.put(t, m)
	table := make([]lbmap.BackendID, m.Maglev6.TableSize())
	for i := range table {
		table[i] = tcpIDs[2]
	}
	if err := m.Maglev6.Put(6, table); err != nil {
		t.Fatal(err)
	}

	calls := socklbtest.Repeat(30, socklbtest.Call{Op: socklbtest.TCP, To: web})
	calls = append(calls,
		socklbtest.Call{Op: socklbtest.UDP, To: dns},
		socklbtest.Call{Op: socklbtest.UDPConnected, To: dns},
		socklbtest.Call{Op: socklbtest.TCP, To: empty},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(svc6, 8080)},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(nodeAddr6, 30080)},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.AddrPortFrom(loopback6, 30081)},
		socklbtest.Call{Op: socklbtest.TCP, To: maglev},
	)
	r := env.Run(calls...)

	counts := reached(t, r[:30])
	for _, be := range backends6 {
		if counts[be.String()] == 0 {
			t.Fatalf("backend %s never reached: %v", be, counts)
		}
	}
	for _, res := range r[:30] {
		if res.Peer != web {
			t.Fatalf("%v: getpeername %v, want %v", res, res.Peer, web)
		}
	}
	for _, res := range r[30:32] {
		if !slices.Contains(backends6, netip.MustParseAddrPort(res.Backend)) || res.From != dns {
			t.Fatalf("%v; want a backend's answer from the service address %v", res, dns)
		}
	}
	wantErrno(t, r[32], "connect", "ECONNREFUSED")
	wantErrno(t, r[33], "connect", "ENETUNREACH")
	for _, res := range r[34:36] {
		if res.Backend != backends6[0].String() || res.Peer != res.Call.To {
			t.Fatalf("%v; want backend %s and the address connected to as peer", res, backends6[0])
		}
	}
	if r[36].Backend != backends6[2].String() {
		t.Fatalf("%v; want the Maglev table's backend %s", r[36], backends6[2])
	}
}

// A dual-stack socket reaches an IPv4 service at its IPv4-mapped address;
// the IPv4 maps serve it, and it sees the mapped service address.
func TestIPv4MappedIPv6(t *testing.T) {
	env := socklbtest.New(t)
	env.RequireIPv6()
	m := env.StartDatapath()
	env.ServeTCP(backends4[0])
	env.ServeUDP(backends4[0])
	tcpIDs := putBackends(t, m, lbmap.TCP, 1, backends4[0])
	udpIDs := putBackends(t, m, lbmap.UDP, 2, backends4[0])
	service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 1, slots: tcpIDs}.put(t, m)
	dns := netip.AddrPortFrom(svc4, 53)
	service{frontend: dns, proto: lbmap.UDP, revNAT: 2, slots: udpIDs}.put(t, m)

	mapped := func(ap netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
	}
	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: mapped(serviceTCP)},
		socklbtest.Call{Op: socklbtest.UDP, To: mapped(dns)},
	)
	if r[0].Backend != backends4[0].String() || r[0].Peer != mapped(serviceTCP) {
		t.Fatalf("%v; want backend %s and peer %v", r[0], backends4[0], mapped(serviceTCP))
	}
	if r[1].Backend != backends4[0].String() || r[1].From != mapped(dns) {
		t.Fatalf("%v; want backend %s answering from %v", r[1], backends4[0], mapped(dns))
	}
}

// attachedEventRing opens the event ring buffer of the connect4 program
// attached to cgroup: whichever map the loader gave the programs, it is
// the one their records go to.
func attachedEventRing(t *testing.T, cgroup string) *ringbuf.Reader {
	t.Helper()
	dir, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(dir.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Programs) != 1 {
		t.Fatalf("%d connect4 programs on cgroup %s, want 1", len(res.Programs), cgroup)
	}
	prog, err := ebpf.NewProgramFromID(res.Programs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, _ := info.MapIDs()
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		mi, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		if mi.Type != ebpf.RingBuf || mi.Name != bpf.SockLBMapCelliumEvents {
			continue
		}
		rd, err := ringbuf.NewReader(m)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rd.Close() })
		return rd
	}
	t.Fatalf("the connect4 program uses no ring buffer %s (maps %v)", bpf.SockLBMapCelliumEvents, ids)
	return nil
}

// sockLBEvents drains the ring buffer (see ringEvents): sock-lb events
// only.
func sockLBEvents(t *testing.T, rd *ringbuf.Reader) []*monitorapi.SockLBEvent {
	t.Helper()
	var evs []*monitorapi.SockLBEvent
	for _, ev := range ringEvents(t, rd, monitorapi.SystemBootClock()) {
		lb, ok := ev.(*monitorapi.SockLBEvent)
		if !ok {
			t.Fatalf("event %v from a socket program, want a sock-lb event", ev)
		}
		evs = append(evs, lb)
	}
	return evs
}

// Each translation, either way, is reported: what the socket asked for,
// what it got, and which socket of which network namespace.
func TestTranslationEvents(t *testing.T) {
	env := socklbtest.New(t)
	m := env.StartDatapath()
	rd := attachedEventRing(t, env.Cgroup)
	env.ServeTCP(backends4[0])
	env.ServeUDP(backends4[1])
	tcpIDs := putBackends(t, m, lbmap.TCP, 1, backends4[0])
	udpIDs := putBackends(t, m, lbmap.UDP, 2, backends4[1])
	service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 7, slots: tcpIDs}.put(t, m)
	dns := netip.AddrPortFrom(svc4, 53)
	service{frontend: dns, proto: lbmap.UDP, revNAT: 8, slots: udpIDs}.put(t, m)

	start := time.Now()
	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: serviceTCP},
		socklbtest.Call{Op: socklbtest.UDP, To: dns},
	)
	if r[0].Backend != backends4[0].String() || r[1].Backend != backends4[1].String() {
		t.Fatalf("%v; want backends %s and %s", r, backends4[0], backends4[1])
	}
	evs := sockLBEvents(t, rd)
	byHook := map[monitorapi.SockLBHook]*monitorapi.SockLBEvent{}
	for _, ev := range evs {
		t.Log(ev)
		if _, dup := byHook[ev.Hook]; dup {
			t.Fatalf("events %v: want one per hook", evs)
		}
		byHook[ev.Hook] = ev
		if ev.SockCookie == 0 || ev.NetnsCookie != evs[0].NetnsCookie || ev.NetnsCookie == 0 {
			t.Fatalf("event %v: want a socket cookie and the client's netns cookie", ev)
		}
		if ev.Time.Before(start.Add(-time.Second)) || ev.Time.After(time.Now().Add(time.Second)) {
			t.Fatalf("event %v at %v, not during the run from %v", ev, ev.Time, start)
		}
	}
	for hook, want := range map[monitorapi.SockLBHook]monitorapi.SockLBEvent{
		monitorapi.SockLBConnect:     {Proto: unix.IPPROTO_TCP, RevNATIndex: 7, Original: serviceTCP, Translated: backends4[0]},
		monitorapi.SockLBGetpeername: {Proto: unix.IPPROTO_TCP, RevNATIndex: 7, Original: backends4[0], Translated: serviceTCP},
		monitorapi.SockLBSendmsg:     {Proto: unix.IPPROTO_UDP, RevNATIndex: 8, Original: dns, Translated: backends4[1]},
		monitorapi.SockLBRecvmsg:     {Proto: unix.IPPROTO_UDP, RevNATIndex: 8, Original: backends4[1], Translated: dns},
	} {
		got := byHook[hook]
		if got == nil || got.Proto != want.Proto || got.RevNATIndex != want.RevNATIndex ||
			got.Original != want.Original || got.Translated != want.Translated {
			t.Fatalf("%s event %v; want %s %s -> %s, rev-nat %d", hook, got, want.Proto, want.Original, want.Translated, want.RevNATIndex)
		}
	}
	// One socket each way.
	if byHook[monitorapi.SockLBConnect].SockCookie != byHook[monitorapi.SockLBGetpeername].SockCookie ||
		byHook[monitorapi.SockLBSendmsg].SockCookie != byHook[monitorapi.SockLBRecvmsg].SockCookie ||
		byHook[monitorapi.SockLBConnect].SockCookie == byHook[monitorapi.SockLBSendmsg].SockCookie {
		t.Fatalf("events %v: want the TCP socket's cookie on connect and getpeername, the UDP socket's on sendmsg and recvmsg", evs)
	}
}

// IPv6 sockets are reported with IPv6 addresses, except at an IPv4-mapped
// address, which the IPv4 maps translate and which is reported as IPv4.
func TestTranslationEventsIPv6(t *testing.T) {
	env := socklbtest.New(t)
	env.RequireIPv6()
	m := env.StartDatapath()
	rd := attachedEventRing(t, env.Cgroup)
	env.AddAddr(netip.PrefixFrom(backends6[0].Addr(), 128))
	env.ServeTCP(backends6[0], backends4[0])
	ids6 := putBackends(t, m, lbmap.TCP, 1, backends6[0])
	ids4 := putBackends(t, m, lbmap.TCP, 2, backends4[0])
	web := netip.AddrPortFrom(svc6, 80)
	service{frontend: web, proto: lbmap.TCP, revNAT: 1, slots: ids6}.put(t, m)
	service{frontend: serviceTCP, proto: lbmap.TCP, revNAT: 2, slots: ids4}.put(t, m)
	mapped := netip.AddrPortFrom(netip.AddrFrom16(svc4.As16()), serviceTCP.Port())

	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: web},
		socklbtest.Call{Op: socklbtest.TCP, To: mapped},
	)
	if r[0].Backend != backends6[0].String() || r[1].Backend != backends4[0].String() {
		t.Fatalf("%v; want backends %s and %s", r, backends6[0], backends4[0])
	}
	type translation struct {
		hook       monitorapi.SockLBHook
		revNAT     uint16
		orig, xlat netip.AddrPort
	}
	var got []translation
	for _, ev := range sockLBEvents(t, rd) {
		got = append(got, translation{ev.Hook, ev.RevNATIndex, ev.Original, ev.Translated})
	}
	want := []translation{
		{monitorapi.SockLBConnect, 1, web, backends6[0]},
		{monitorapi.SockLBGetpeername, 1, backends6[0], web},
		{monitorapi.SockLBConnect, 2, serviceTCP, backends4[0]},
		{monitorapi.SockLBGetpeername, 2, backends4[0], serviceTCP},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("translations %v, want %v", got, want)
	}
}
