package bpf_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/ipcachemap"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/policymap"
)

// Identities of the policy tests, in the ipcache: pod A is X, pod B Y,
// the remote address Z, the node's own address the host.
const (
	idX    = 1000
	idY    = 2000
	idZ    = 3000
	idHost = 1
)

var hostAddr = netip.MustParseAddr("10.0.0.1")

// loadPolicyLXC is loadLXC with the test identities in the ipcache.
func loadPolicyLXC(t testing.TB) *lxc {
	t.Helper()
	l := loadLXC(t, lxcOptions{aggregation: true})
	for addr, id := range map[netip.Addr]uint32{podA: idX, podB: idY, remote: idZ, hostAddr: idHost, podA6: idX, podB6: idY} {
		if err := l.ipcache.Put(ipcachemap.KeyOf(netip.PrefixFrom(addr, addr.BitLen())), ipcachemap.Value{Identity: id}); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// isolate sets the directions ep is isolated in.
func (l *lxc) isolate(ep uint16, flags uint8) {
	l.t.Helper()
	if err := l.enforcement.Put(uint32(ep), policymap.Enforcement{Flags: flags}); err != nil {
		l.t.Fatal(err)
	}
}

// allow writes an allow's keys into the policy map, as the policy-maps
// cell does.
func (l *lxc) allow(a policymap.Allow) {
	l.t.Helper()
	keys, err := policymap.KeysOf(a)
	if err != nil {
		l.t.Fatal(err)
	}
	for _, k := range keys {
		if err := l.policy.Put(k, policymap.Value{PrefixLen: k.PrefixLen}); err != nil {
			l.t.Fatalf("put %v: %v", k, err)
		}
	}
}

// policyDrop checks that the last runs reported one drop event, a policy
// drop in dir.
func (l *lxc) policyDrop(dir monitorapi.Direction, ep uint16) {
	l.t.Helper()
	ev := l.drop()
	if ev.Reason != monitorapi.DropPolicyDenied || ev.Flow.Direction != dir || ev.EndpointID != ep {
		l.t.Fatalf("drop %v, want policy-denied %s of endpoint %d", ev, dir, ep)
	}
}

// allowed checks that the last runs reported a trace and a policy
// verdict of match in dir, and returns the trace.
func (l *lxc) allowed(dir monitorapi.Direction, match monitorapi.PolicyMatch) *monitorapi.TraceEvent {
	l.t.Helper()
	evs := l.events()
	if len(evs) != 2 {
		l.t.Fatalf("events %v, want a trace and a policy verdict", evs)
	}
	tr, ok1 := evs[0].(*monitorapi.TraceEvent)
	pv, ok2 := evs[1].(*monitorapi.PolicyVerdictEvent)
	if !ok1 || !ok2 || pv.Match != match || pv.Flow.Direction != dir {
		l.t.Fatalf("events %v, want a trace and a policy verdict %s %s", evs, match, dir)
	}
	return tr
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// Ingress: B is isolated with one allow, identity X on TCP/80.
func TestLXCPolicyIngress(t *testing.T) {
	for _, fam := range []struct {
		name          string
		a, b, outside netip.Addr
	}{{"IPv4", podA, podB, remote}, {"IPv6", podA6, podB6, netip.Addr{}}} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadPolicyLXC(t)
			l.isolate(epB, policymap.FlagIngress)
			l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idX, Proto: unix.IPPROTO_TCP, Port: 80})

			// X to 80: allowed, tracked, one verdict.
			l.run(l.to, tcpPacket(ap(fam.a, 40000), ap(fam.b, 80), syn), verdictNext)
			l.allowed(monitorapi.DirectionIngress, monitorapi.PolicyMatchL3L4)
			l.entry(tcpKey(ap(fam.a, 40000), ap(fam.b, 80), 2))
			// Its reply and its later packets pass without a verdict.
			l.run(l.from, tcpPacket(ap(fam.b, 80), ap(fam.a, 40000), synAck), verdictNext)
			if tr := l.trace(); tr.Flow.CTState != monitorapi.CTReply {
				t.Fatalf("reply traced %v, want ct=reply", tr)
			}
			l.run(l.to, tcpPacket(ap(fam.a, 40000), ap(fam.b, 80), ack), verdictNext)
			// No verdict: at most a trace (none in the SYN's second).
			for _, ev := range l.events() {
				if tr, ok := ev.(*monitorapi.TraceEvent); !ok || tr.Flow.CTState != monitorapi.CTEstablished {
					t.Fatalf("established packet reported %v, want at most a trace", ev)
				}
			}

			// X to 81: dropped, nothing tracked.
			l.run(l.to, tcpPacket(ap(fam.a, 40001), ap(fam.b, 81), syn), verdictDrop)
			l.policyDrop(monitorapi.DirectionIngress, epB)
			l.noEntry(tcpKey(ap(fam.a, 40001), ap(fam.b, 81), 2))
			// UDP to 80: dropped.
			l.run(l.to, udpPacket(ap(fam.a, 40002), ap(fam.b, 80)), verdictDrop)
			l.policyDrop(monitorapi.DirectionIngress, epB)
			if fam.outside.IsValid() {
				// Z to 80: dropped, every retry again.
				for range 2 {
					l.run(l.to, tcpPacket(ap(fam.outside, 40000), ap(fam.b, 80), syn), verdictDrop)
					l.policyDrop(monitorapi.DirectionIngress, epB)
				}
				l.noEntry(tcpKey(ap(fam.outside, 40000), ap(fam.b, 80), 2))
			}

			// A is not isolated: anything into it passes, with no verdict.
			l.run(l.to, tcpPacket(ap(fam.b, 40003), ap(fam.a, 81), syn), verdictNext)
			l.trace()
			// B's egress is not isolated.
			l.run(l.from, udpPacket(ap(fam.b, 40004), ap(fam.a, 53)), verdictNext)
			l.trace()
		})
	}
}

// The host's ingress always passes; the host is identity 1 in the ipcache.
func TestLXCPolicyHost(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epB, policymap.FlagIngress|policymap.FlagEgress)
	l.run(l.to, tcpPacket(ap(hostAddr, 40000), ap(podB, 8080), syn), verdictNext)
	l.allowed(monitorapi.DirectionIngress, monitorapi.PolicyMatchHost)
	// Not on egress: B to its node is decided by B's egress allows.
	l.run(l.from, tcpPacket(ap(podB, 40000), ap(hostAddr, 8080), syn), verdictDrop)
	l.policyDrop(monitorapi.DirectionEgress, epB)
}

// Port ranges, any identity and any protocol.
func TestLXCPolicyMatches(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epB, policymap.FlagIngress)
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idX, Proto: unix.IPPROTO_TCP, Port: 8000, EndPort: 8010})
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Proto: unix.IPPROTO_TCP, Port: 443})
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idZ})
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idX, Proto: unix.IPPROTO_UDP})

	sport := uint16(30000)
	for _, tc := range []struct {
		name  string
		src   netip.Addr
		proto uint8
		port  uint16
		match monitorapi.PolicyMatch // 0: denied
	}{
		{"range: first port", podA, unix.IPPROTO_TCP, 8000, monitorapi.PolicyMatchL3L4},
		{"range: inside", podA, unix.IPPROTO_TCP, 8005, monitorapi.PolicyMatchL3L4},
		{"range: last port", podA, unix.IPPROTO_TCP, 8010, monitorapi.PolicyMatchL3L4},
		{"range: below", podA, unix.IPPROTO_TCP, 7999, 0},
		{"range: above", podA, unix.IPPROTO_TCP, 8011, 0},
		{"any identity", podA, unix.IPPROTO_TCP, 443, monitorapi.PolicyMatchL4Only},
		{"any identity, other peer", remote, unix.IPPROTO_TCP, 443, monitorapi.PolicyMatchL3Only},
		{"any protocol of Z: TCP", remote, unix.IPPROTO_TCP, 22, monitorapi.PolicyMatchL3Only},
		{"any protocol of Z: UDP", remote, unix.IPPROTO_UDP, 53, monitorapi.PolicyMatchL3Only},
		{"every UDP port of X", podA, unix.IPPROTO_UDP, 9999, monitorapi.PolicyMatchL3L4},
		{"every UDP port of X, not of Y's pod", podB, unix.IPPROTO_UDP, 9999, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := l.on(t)
			sport++
			pkt := udpPacket(ap(tc.src, sport), ap(podB, tc.port))
			if tc.proto == unix.IPPROTO_TCP {
				pkt = tcpPacket(ap(tc.src, sport), ap(podB, tc.port), syn)
			}
			if tc.match == 0 {
				l.run(l.to, pkt, verdictDrop)
				l.policyDrop(monitorapi.DirectionIngress, epB)
				return
			}
			l.run(l.to, pkt, verdictNext)
			l.allowed(monitorapi.DirectionIngress, tc.match)
		})
	}
}

// sctpPacket is an SCTP packet whose common header is hdrLen bytes long
// (12 is all of it: ports, verification tag, checksum).
func sctpPacket(src, dst netip.AddrPort, hdrLen int) []byte {
	h := make([]byte, hdrLen)
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	return ipPacket(src.Addr(), dst.Addr(), unix.IPPROTO_SCTP, h)
}

// SCTP's ports are matched as SCTP's, never as TCP's; a protocol with no
// port allows all its ports.
func TestLXCPolicySCTP(t *testing.T) {
	for _, fam := range []struct {
		name string
		a, b netip.Addr
	}{{"IPv4", podA, podB}, {"IPv6", podA6, podB6}} {
		for _, tc := range []struct {
			name  string
			allow policymap.Allow
			match monitorapi.PolicyMatch // 0: denied
		}{
			{"SCTP/80", policymap.Allow{Proto: unix.IPPROTO_SCTP, Port: 80}, monitorapi.PolicyMatchL3L4},
			{"every SCTP port", policymap.Allow{Proto: unix.IPPROTO_SCTP}, monitorapi.PolicyMatchL3L4},
			{"TCP/80", policymap.Allow{Proto: unix.IPPROTO_TCP, Port: 80}, 0},
			{"UDP/80", policymap.Allow{Proto: unix.IPPROTO_UDP, Port: 80}, 0},
			{"SCTP/81", policymap.Allow{Proto: unix.IPPROTO_SCTP, Port: 81}, 0},
		} {
			t.Run(fam.name+"/"+tc.name, func(t *testing.T) {
				l := loadPolicyLXC(t)
				l.isolate(epB, policymap.FlagIngress)
				a := tc.allow
				a.EndpointID, a.Direction, a.Identity = epB, policymap.Ingress, idX
				l.allow(a)

				src, dst := ap(fam.a, 40000), ap(fam.b, 80)
				if tc.match == 0 {
					l.run(l.to, sctpPacket(src, dst, 12), verdictDrop)
					l.policyDrop(monitorapi.DirectionIngress, epB)
					l.noEntry(ctKey(unix.IPPROTO_SCTP, src, dst, 2))
					return
				}
				l.run(l.to, sctpPacket(src, dst, 12), verdictNext)
				checkTrace(t, l.allowed(monitorapi.DirectionIngress, tc.match),
					monitorapi.TraceToEndpoint, epB, monitorapi.CTNew, src, dst)
				l.entry(ctKey(unix.IPPROTO_SCTP, src, dst, 2))
				// The reply is the connection's, with no verdict.
				l.run(l.from, sctpPacket(dst, src, 12), verdictNext)
				if tr := l.trace(); tr.Flow.CTState != monitorapi.CTReply {
					t.Fatalf("reply traced %v, want ct=reply", tr)
				}
				// An ICMP error quoting the reply is related by the
				// quoted ports; quoting another port it is not.
				l.run(l.to, unreachable(fam.a, fam.b, sctpPacket(dst, src, 12)), verdictNext)
				if tr := l.trace(); tr.Flow.CTState != monitorapi.CTRelated {
					t.Fatalf("error traced %v, want ct=related", tr)
				}
				l.run(l.to, unreachable(fam.a, fam.b, sctpPacket(ap(fam.b, 81), src, 12)), verdictDrop)
				l.policyDrop(monitorapi.DirectionIngress, epB)
			})
		}
	}

	// A common header cut short of its 12 bytes is invalid.
	l := loadPolicyLXC(t)
	l.run(l.to, sctpPacket(ap(podA, 40000), ap(podB, 80), 8), verdictDrop)
	if ev := l.drop(); ev.Reason != monitorapi.DropInvalidPacket {
		t.Fatalf("drop %v, want invalid-packet", ev)
	}
}

// Egress: A is isolated with one allow, to identity Y on UDP/53; a
// connection into A is replied to whatever A's egress says.
func TestLXCPolicyEgress(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epA, policymap.FlagEgress)
	l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Egress, Identity: idY, Proto: unix.IPPROTO_UDP, Port: 53})

	l.run(l.from, udpPacket(ap(podA, 5000), ap(podB, 53)), verdictNext)
	l.allowed(monitorapi.DirectionEgress, monitorapi.PolicyMatchL3L4)
	l.run(l.from, udpPacket(ap(podA, 5001), ap(remote, 53)), verdictDrop)
	l.policyDrop(monitorapi.DirectionEgress, epA)
	l.run(l.from, udpPacket(ap(podA, 5002), ap(podB, 54)), verdictDrop)
	l.policyDrop(monitorapi.DirectionEgress, epA)

	// Z connects to A (ingress not isolated); A's answer is a reply.
	l.run(l.to, tcpPacket(ap(remote, 40000), ap(podA, 80), syn), verdictNext)
	l.trace()
	l.run(l.from, tcpPacket(ap(podA, 80), ap(remote, 40000), synAck), verdictNext)
	if tr := l.trace(); tr.Flow.CTState != monitorapi.CTReply {
		t.Fatalf("reply traced %v, want ct=reply", tr)
	}
}

// A forged source does not escape the egress policy: A, isolated for
// egress with no allow, sends from its interface with a source that is no
// endpoint's (any pod with CAP_NET_RAW can), which once found no endpoint
// and so no policy, and passed. It is dropped before policy.
func TestLXCPolicyForgedSourceEgress(t *testing.T) {
	for _, fam := range []struct {
		name              string
		a, stranger, x, b netip.Addr
	}{
		{"IPv4", podA, netip.MustParseAddr("10.244.0.99"), remote, podB},
		{"IPv6", podA6, netip.MustParseAddr("fd00:244::99"), remote6, podB6},
	} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadPolicyLXC(t)
			l.isolate(epA, policymap.FlagEgress)
			// A's own address: denied by policy.
			l.run(l.from, udpPacket(ap(fam.a, 5000), ap(fam.x, 53)), verdictDrop)
			l.policyDrop(monitorapi.DirectionEgress, epA)
			// From A's interface with a source no endpoint has, or
			// B's, whose egress is not isolated: dropped, no entry.
			for _, src := range []netip.Addr{fam.stranger, fam.b} {
				pkt := udpPacket(ap(src, 5000), ap(fam.x, 53))
				l.runOn(l.devA, &ebpf.RunOptions{Data: pkt}, l.from, verdictDrop)
				if ev := l.drop(); ev.Reason != monitorapi.DropInvalidSource || ev.EndpointID != 0 {
					t.Fatalf("%v from A's interface: %v, want an invalid-source drop", src, ev)
				}
				l.noEntry(ctKey(unix.IPPROTO_UDP, ap(src, 5000), ap(fam.x, 53), 0))
			}
		})
	}
}

// A forged source does not open another endpoint's ingress: B is isolated
// for ingress with no allow. A sends from its interface a SYN-ACK with B:80
// as source to A:5555 (B's egress is not isolated, so this once made
// conntrack's entry B:80 -> A:5555), then a SYN to B:80, which B's
// to-endpoint program found as the reply of that entry and let in without
// a policy decision. The forged packet is dropped and plants nothing; the
// SYN is denied.
func TestLXCPolicyForgedReplyIngress(t *testing.T) {
	for _, fam := range []struct {
		name string
		a, b netip.Addr
	}{{"IPv4", podA, podB}, {"IPv6", podA6, podB6}} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadPolicyLXC(t)
			l.isolate(epB, policymap.FlagIngress)
			forged := tcpPacket(ap(fam.b, 80), ap(fam.a, 5555), synAck)
			l.runOn(l.devA, &ebpf.RunOptions{Data: forged}, l.from, verdictDrop)
			if ev := l.drop(); ev.Reason != monitorapi.DropInvalidSource {
				t.Fatalf("forged SYN-ACK from A's interface: %v, want an invalid-source drop", ev)
			}
			l.noEntry(tcpKey(ap(fam.b, 80), ap(fam.a, 5555), 0))

			// A's SYN to B:80 leaves A (not isolated) and is denied
			// into B.
			l.run(l.from, tcpPacket(ap(fam.a, 5555), ap(fam.b, 80), syn), verdictNext)
			l.trace()
			l.run(l.to, tcpPacket(ap(fam.a, 5555), ap(fam.b, 80), syn), verdictDrop)
			l.policyDrop(monitorapi.DirectionIngress, epB)
		})
	}
}

// The policy-verdict event carries the cookie of the entry that allowed
// the connection, of any kind of match; the host's ingress has none.
func TestLXCPolicyVerdictCookie(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epB, policymap.FlagIngress)
	put := func(a policymap.Allow, cookie uint32) {
		keys, err := policymap.KeysOf(a)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if err := l.policy.Put(k, policymap.Value{PrefixLen: k.PrefixLen, Cookie: cookie}); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idX, Proto: unix.IPPROTO_TCP, Port: 80}, 0xc0c0a)
	put(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Proto: unix.IPPROTO_TCP, Port: 443}, 0xc0c0b)
	for _, tc := range []struct {
		src    netip.Addr
		port   uint16
		match  monitorapi.PolicyMatch
		cookie uint32
	}{
		{podA, 80, monitorapi.PolicyMatchL3L4, 0xc0c0a},
		{remote, 443, monitorapi.PolicyMatchL4Only, 0xc0c0b},
		{hostAddr, 22, monitorapi.PolicyMatchHost, 0},
	} {
		l.run(l.to, tcpPacket(ap(tc.src, 41000+tc.port), ap(podB, tc.port), syn), verdictNext)
		evs := l.events()
		if len(evs) != 2 {
			t.Fatalf("%s:%d: events %v, want a trace and a verdict", tc.src, tc.port, evs)
		}
		pv, ok := evs[1].(*monitorapi.PolicyVerdictEvent)
		if !ok || pv.Match != tc.match || pv.Flow.PolicyCookie != tc.cookie {
			t.Fatalf("%s:%d: verdict %+v, want match %s with cookie %#x", tc.src, tc.port, evs[1], tc.match, tc.cookie)
		}
	}
}

// prefix puts an ipBlock prefix with its ID into the prefix trie, as the
// policy-maps cell does.
func (l *lxc) prefix(p string, id uint32) {
	l.t.Helper()
	if err := l.prefixes.Put(policymap.PrefixKeyOf(netip.MustParsePrefix(p)), policymap.PrefixValue{ID: id}); err != nil {
		l.t.Fatal(err)
	}
}

// ipBlocks: a peer's address resolves to the ID of its longest prefix in
// the prefix trie, which the allows name; an except prefix has an ID of
// its own that the ipBlock does not allow. Pod addresses match too.
func TestLXCPolicyPrefixes(t *testing.T) {
	const (
		world24  = policymap.MinPrefixID + 1 // 192.0.2.0/24
		remote32 = policymap.MinPrefixID + 2 // 192.0.2.1/32, an except of the /24
		pods16   = policymap.MinPrefixID + 3 // 10.244.0.0/16
		podB32   = policymap.MinPrefixID + 4 // 10.244.0.3/32, an except of the /16
		podA32   = policymap.MinPrefixID + 5 // 10.244.0.2/32
		doc32    = policymap.MinPrefixID + 6 // 2001:db8::/32
	)
	l := loadPolicyLXC(t)
	l.prefix("192.0.2.0/24", world24)
	l.prefix("192.0.2.1/32", remote32)
	l.prefix("10.244.0.0/16", pods16)
	l.prefix("10.244.0.3/32", podB32)
	l.prefix("10.244.0.2/32", podA32)
	l.prefix("2001:db8::/32", doc32)
	l.isolate(epA, policymap.FlagEgress)
	l.isolate(epB, policymap.FlagIngress)
	// B: from 192.0.2.0/24 except 192.0.2.1/32 on TCP/80; from A's
	// address on TCP/8080; from 2001:db8::/32, anything.
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: world24, Proto: unix.IPPROTO_TCP, Port: 80})
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: podA32, Proto: unix.IPPROTO_TCP, Port: 8080})
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: doc32})
	// A: to 10.244.0.0/16 except B's address, anything.
	l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Egress, Identity: pods16})
	l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Egress, Identity: podA32})

	other := netip.MustParseAddr("192.0.2.7")
	sport := uint16(20000)
	for _, tc := range []struct {
		name     string
		to       bool // the to-endpoint program (B's ingress), else A's egress
		src, dst netip.Addr
		port     uint16
		match    monitorapi.PolicyMatch // 0: denied
	}{
		{"inside the cidr", true, other, podB, 80, monitorapi.PolicyMatchL3L4},
		{"inside the cidr, other port", true, other, podB, 81, 0},
		{"in the except", true, remote, podB, 80, 0},
		{"a pod's address, identity not allowed", true, podA, podB, 8080, monitorapi.PolicyMatchL3L4},
		{"a pod's address, other port", true, podA, podB, 80, 0},
		{"IPv6 prefix", true, remote6, podB6, 22, monitorapi.PolicyMatchL3Only},
		{"IPv6 pod outside the prefix", true, podA6, podB6, 22, 0},
		{"egress into the cidr", false, podA, netip.MustParseAddr("10.244.7.9"), 443, monitorapi.PolicyMatchL3Only},
		{"egress to a pod in the except", false, podA, podB, 443, 0},
		{"egress outside the cidr", false, podA, other, 443, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := l.on(t)
			sport++
			prog, dir, ep := l.from, monitorapi.DirectionEgress, epA
			if tc.to {
				prog, dir, ep = l.to, monitorapi.DirectionIngress, epB
			}
			pkt := tcpPacket(ap(tc.src, sport), ap(tc.dst, tc.port), syn)
			if tc.match == 0 {
				l.run(prog, pkt, verdictDrop)
				l.policyDrop(dir, ep)
				return
			}
			l.run(prog, pkt, verdictNext)
			l.allowed(dir, tc.match)
		})
	}
}

// unreachable is an ICMP destination unreachable, or ICMPv6's, from src to
// dst that quotes frame's IP packet.
func unreachable(src, dst netip.Addr, frame []byte) []byte {
	if src.Is4() {
		return icmpError(src, dst, icmpUnreachable, 0, frame, 0)
	}
	h := make([]byte, 8)
	h[0] = 1
	return ipPacket(src, dst, unix.IPPROTO_ICMPV6, append(h, frame[14:]...))
}

// routerAlert is a hop-by-hop header with the Router Alert option (MLD),
// whose next header is nh.
func routerAlert(nh uint8) []byte {
	return []byte{nh, 0, 5, 2, 0, 0, 1, 0}
}

// MLD carries a hop-by-hop header (Router Alert): it passes A's isolated
// directions untracked, from a link-local or the unspecified source,
// through the walk of the extension headers (it once was protocol 0, whose
// policy dropped it).
func TestLXCPolicyMLD(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epA, policymap.FlagIngress|policymap.FlagEgress)
	const mldQuery, mld2Report = 130, 143
	for _, src := range []netip.Addr{netip.MustParseAddr("fe80::2"), netip.IPv6Unspecified()} {
		report := ip6With(src, netip.MustParseAddr("ff02::16"), ip6Hop, icmpPacket(src, src, mld2Report, 0, 0), routerAlert(unix.IPPROTO_ICMPV6))
		l.runOn(l.devA, &ebpf.RunOptions{Data: report}, l.from, verdictNext)
		if tr := l.trace(); tr.Flow.Proto != unix.IPPROTO_ICMPV6 || tr.Flow.ICMPType != mld2Report || tr.Flow.CTState != monitorapi.CTUnknown {
			t.Fatalf("MLD report from %v traced %v, want ICMPv6 type %d untracked", src, tr, mld2Report)
		}
	}
	router := netip.MustParseAddr("fe80::1")
	query := ip6With(router, netip.MustParseAddr("ff02::1"), ip6Hop, icmpPacket(router, router, mldQuery, 0, 0), routerAlert(unix.IPPROTO_ICMPV6))
	l.run(l.to, query, verdictNext)
	if tr := l.trace(); tr.Flow.ICMPType != mldQuery || tr.Flow.CTState != monitorapi.CTUnknown {
		t.Fatalf("MLD query traced %v, want ICMPv6 type %d untracked", tr, mldQuery)
	}
	if n := l.entries(); n != 0 {
		t.Fatalf("%d entries after MLD, want none", n)
	}
}

// The first fragment of a UDP datagram is decided as UDP with its ports:
// A, whose egress allows UDP/53 to Y, sends a large datagram to B:53 (it
// was decided as protocol 44 without ports, and dropped), and not to B:54.
// The allowed datagram's later fragment passes, the denied one's does not.
func TestLXCPolicyIPv6FirstFragment(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epA, policymap.FlagEgress)
	l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Egress, Identity: idY, Proto: unix.IPPROTO_UDP, Port: 53})
	for _, tc := range []struct {
		port    uint16
		allowed bool
		id      uint32
	}{{53, true, 42}, {54, false, 43}} {
		src, dst := ap(podA6, 5001), ap(podB6, tc.port)
		first := ip6With(podA6, podB6, ip6Fragment, udpPacket(src, dst), ip6Frag(unix.IPPROTO_UDP, 0, true, tc.id))
		later := ip6With(podA6, podB6, ip6Fragment, udpPacket(src, dst), ip6Frag(unix.IPPROTO_UDP, 185, false, tc.id))
		if !tc.allowed {
			l.run(l.from, first, verdictDrop)
			l.policyDrop(monitorapi.DirectionEgress, epA)
			l.run(l.from, later, verdictDrop)
			l.policyDrop(monitorapi.DirectionEgress, epA)
			continue
		}
		l.run(l.from, first, verdictNext)
		tr := l.allowed(monitorapi.DirectionEgress, monitorapi.PolicyMatchL3L4)
		if tr.Flow.Proto != unix.IPPROTO_UDP || tr.Flow.DstPort != tc.port {
			t.Fatalf("first fragment traced %v, want UDP to port %d", tr, tc.port)
		}
		l.entry(ctKey(unix.IPPROTO_UDP, src, dst, 0))
		l.run(l.from, later, verdictNext)
		if tr := l.trace(); tr.Flow.CTState != monitorapi.CTUnknown || tr.Flow.Proto != unix.IPPROTO_UDP {
			t.Fatalf("later fragment of the allowed datagram traced %v, want UDP untracked", tr)
		}
	}
}

// A later fragment has no ports: in an isolated direction it passes if
// its datagram's first fragment did, and otherwise only if the peer may
// use every port of its protocol. It is never a reply by itself:
// one fragmented datagram of A's to Z (A's egress is not isolated) once
// made an entry of protocol 44 without ports, which let Z send A any
// fragment, a TCP SYN to port 22 in an atomic fragment included, past A's
// ingress isolation. Now the datagram's entry is UDP's and the SYN is
// decided as TCP to 22.
func TestLXCPolicyIPv6LaterFragments(t *testing.T) {
	l := loadPolicyLXC(t)
	if err := l.ipcache.Put(ipcachemap.KeyOf(netip.PrefixFrom(remote6, 128)), ipcachemap.Value{Identity: idZ}); err != nil {
		t.Fatal(err)
	}
	l.isolate(epA, policymap.FlagIngress)
	a, z := ap(podA6, 53), ap(remote6, 5000)
	first := ip6With(podA6, remote6, ip6Fragment, udpPacket(a, z), ip6Frag(unix.IPPROTO_UDP, 0, true, 42))
	l.run(l.from, first, verdictNext)
	l.trace()
	l.entry(ctKey(unix.IPPROTO_UDP, a, z, 0))
	l.noEntry(ctmap.NewKey6(ip6Fragment, ap(podA6, 0), ap(remote6, 0), 0))

	// Z's SYN to A:22 in an atomic fragment (offset 0, the last).
	syn22 := ip6With(remote6, podA6, ip6Fragment, tcpPacket(ap(remote6, 4000), ap(podA6, 22), syn), ip6Frag(unix.IPPROTO_TCP, 0, false, 43))
	l.run(l.to, syn22, verdictDrop)
	l.policyDrop(monitorapi.DirectionIngress, epA)
	// Z's fragmented reply: its first fragment is a reply, and its later
	// fragment passes with it; another datagram's does not.
	reply := ip6With(remote6, podA6, ip6Fragment, udpPacket(z, a), ip6Frag(unix.IPPROTO_UDP, 0, true, 50))
	l.run(l.to, reply, verdictNext)
	if tr := l.trace(); tr.Flow.CTState != monitorapi.CTReply {
		t.Fatalf("first fragment of Z's reply traced %v, want ct=reply", tr)
	}
	l.run(l.to, ip6With(remote6, podA6, ip6Fragment, udpPacket(z, a), ip6Frag(unix.IPPROTO_UDP, 185, false, 50)), verdictNext)
	if tr := l.trace(); tr.Flow.CTState != monitorapi.CTUnknown {
		t.Fatalf("later fragment of Z's reply traced %v, want untracked", tr)
	}
	// Later fragments from Z of no datagram that passed, UDP and TCP:
	// denied.
	laterUDP := ip6With(remote6, podA6, ip6Fragment, udpPacket(z, a), ip6Frag(unix.IPPROTO_UDP, 185, false, 44))
	laterTCP := ip6With(remote6, podA6, ip6Fragment, tcpPacket(ap(remote6, 4000), ap(podA6, 22), ack), ip6Frag(unix.IPPROTO_TCP, 185, false, 45))
	for _, pkt := range [][]byte{laterUDP, laterTCP} {
		l.run(l.to, pkt, verdictDrop)
		l.policyDrop(monitorapi.DirectionIngress, epA)
	}
	// With every UDP port of Z allowed, Z's later UDP fragments pass
	// (untracked), TCP's still do not; a port of UDP is not enough.
	l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_TCP, Port: 22})
	l.run(l.to, laterTCP, verdictDrop)
	l.policyDrop(monitorapi.DirectionIngress, epA)
	l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_UDP})
	l.run(l.to, laterUDP, verdictNext)
	if tr := l.allowed(monitorapi.DirectionIngress, monitorapi.PolicyMatchL3L4); tr.Flow.CTState != monitorapi.CTUnknown || tr.Flow.Proto != unix.IPPROTO_UDP {
		t.Fatalf("later UDP fragment traced %v, want UDP untracked", tr)
	}
	// A's egress is not isolated: its later fragments pass, whatever the
	// first.
	l.run(l.from, ip6With(podA6, remote6, ip6Fragment, udpPacket(a, z), ip6Frag(unix.IPPROTO_UDP, 185, false, 42)), verdictNext)
	l.trace()
}

// The fragmentable part of an IPv6 datagram may start with a destination
// options header or AH (RFC 8200 4.1, 4.5), so the first fragment's walk
// ends at UDP while each Fragment header names 60 or 51: Z's allowed
// datagram to A:53 passes in every fragment (the later one found no entry
// when the entry was kept under the walk's UDP and was dropped), and a
// later fragment of another identification is still denied.
func TestLXCPolicyIPv6FragmentsBehindExtHeaders(t *testing.T) {
	for _, tc := range []struct {
		name string
		nh   uint8    // the Fragment header's next header
		hdrs [][]byte // what follows it in the first fragment
	}{
		{"plain", unix.IPPROTO_UDP, nil},
		{"destination-options", ip6Dest, [][]byte{ip6Ext(unix.IPPROTO_UDP, 1)}},
		{"ah", ip6Auth, [][]byte{ip6AH(unix.IPPROTO_UDP, 4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := loadPolicyLXC(t)
			if err := l.ipcache.Put(ipcachemap.KeyOf(netip.PrefixFrom(remote6, 128)), ipcachemap.Value{Identity: idZ}); err != nil {
				t.Fatal(err)
			}
			l.isolate(epA, policymap.FlagIngress)
			l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_UDP, Port: 53})
			z, a := ap(remote6, 5000), ap(podA6, 53)
			hdrs := append([][]byte{ip6Frag(tc.nh, 0, true, 77)}, tc.hdrs...)
			l.run(l.to, ip6With(remote6, podA6, ip6Fragment, udpPacket(z, a), hdrs...), verdictNext)
			if tr := l.allowed(monitorapi.DirectionIngress, monitorapi.PolicyMatchL3L4); tr.Flow.Proto != unix.IPPROTO_UDP || tr.Flow.DstPort != 53 {
				t.Fatalf("first fragment traced %v, want UDP to port 53", tr)
			}
			l.run(l.to, ip6With(remote6, podA6, ip6Fragment, udpPacket(z, a), ip6Frag(tc.nh, 185, false, 77)), verdictNext)
			if tr := l.trace(); tr.Flow.CTState != monitorapi.CTUnknown || tr.Flow.Proto != monitorapi.Proto(tc.nh) {
				t.Fatalf("later fragment traced %v, want protocol %d untracked", tr, tc.nh)
			}
			l.run(l.to, ip6With(remote6, podA6, ip6Fragment, udpPacket(z, a), ip6Frag(tc.nh, 185, false, 78)), verdictDrop)
			l.policyDrop(monitorapi.DirectionIngress, epA)
		})
	}
}

// IPv4's later fragments as IPv6's: B is isolated for ingress and allows
// Z UDP/53; Z's datagram to B:53 passes in every fragment, a later
// fragment of no datagram that passed is denied (it once always passed).
func TestLXCPolicyIPv4LaterFragments(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epB, policymap.FlagIngress)
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_UDP, Port: 53})
	z, b := ap(remote, 5000), ap(podB, 53)
	fragment := func(id, fragOff uint16) []byte {
		pkt := udpPacket(z, b)
		binary.BigEndian.PutUint16(pkt[14+4:], id)
		binary.BigEndian.PutUint16(pkt[14+6:], fragOff)
		return pkt
	}
	l.run(l.to, fragment(7, 0x2000), verdictNext) // more fragments, offset 0
	l.allowed(monitorapi.DirectionIngress, monitorapi.PolicyMatchL3L4)
	l.run(l.to, fragment(7, 185), verdictNext) // offset 1480 bytes, the last
	if tr := l.trace(); tr.Flow.CTState != monitorapi.CTUnknown {
		t.Fatalf("later fragment traced %v, want untracked", tr)
	}
	l.run(l.to, fragment(8, 185), verdictDrop)
	l.policyDrop(monitorapi.DirectionIngress, epB)
	// An unfragmented datagram remembers nothing: a later fragment of
	// its identification is denied.
	l.run(l.to, fragment(9, 0), verdictNext)
	l.events()
	l.run(l.to, fragment(9, 185), verdictDrop)
	l.policyDrop(monitorapi.DirectionIngress, epB)
}

// fragKey and fragEntry are struct frag_key and frag_entry of lxc.c.
type fragKey struct {
	Src, Dst [16]byte
	ID       uint32
	Family   uint8
	Proto    uint8
	Flags    uint8
	_        uint8
}

type fragEntry struct{ Expires uint32 }

// A first fragment that passes is remembered for 60 seconds; a later
// fragment whose entry expired is decided as if its first was not seen.
func TestLXCFragmentLifetime(t *testing.T) {
	l := loadPolicyLXC(t)
	l.isolate(epB, policymap.FlagIngress)
	l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_UDP, Port: 53})
	z, b := ap(remote, 5000), ap(podB, 53)
	fragment := func(id, fragOff uint16) []byte {
		pkt := udpPacket(z, b)
		binary.BigEndian.PutUint16(pkt[14+4:], id)
		binary.BigEndian.PutUint16(pkt[14+6:], fragOff)
		return pkt
	}
	w := during(func() { l.run(l.to, fragment(11, 0x2000), verdictNext) })
	l.events()
	key := fragKey{ID: 11, Family: 4, Proto: unix.IPPROTO_UDP, Flags: ctmap.KeyIncoming}
	copy(key.Src[:], remote.AsSlice())
	copy(key.Dst[:], podB.AsSlice())
	var e fragEntry
	if err := l.frags.Lookup(key, &e); err != nil {
		t.Fatalf("fragment entry %+v: %v", key, err)
	}
	w.check(t, "fragment entry's expiry", e.Expires, 60)

	if err := l.frags.Put(key, fragEntry{Expires: ctmap.Now() - 1}); err != nil {
		t.Fatal(err)
	}
	l.run(l.to, fragment(11, 185), verdictDrop)
	l.policyDrop(monitorapi.DirectionIngress, epB)
	if err := l.frags.Put(key, fragEntry{Expires: ctmap.Now() + 5}); err != nil {
		t.Fatal(err)
	}
	l.run(l.to, fragment(11, 185), verdictNext)
	l.trace()
}

// ICMP errors about a tracked connection pass an isolated direction,
// others do not; neighbour discovery always passes.
func TestLXCPolicyICMPErrors(t *testing.T) {
	for _, fam := range []struct {
		name       string
		a, outside netip.Addr
	}{{"IPv4", podA, remote}, {"IPv6", podA6, remote6}} {
		t.Run(fam.name, func(t *testing.T) {
			l := loadPolicyLXC(t)
			l.isolate(epA, policymap.FlagIngress|policymap.FlagEgress)
			l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Egress, Proto: unix.IPPROTO_TCP, Port: 80})
			syn80 := tcpPacket(ap(fam.a, 40000), ap(fam.outside, 80), syn)
			l.run(l.from, syn80, verdictNext)
			l.allowed(monitorapi.DirectionEgress, monitorapi.PolicyMatchL4Only)

			l.run(l.to, unreachable(fam.outside, fam.a, syn80), verdictNext)
			if tr := l.trace(); tr.Flow.CTState != monitorapi.CTRelated {
				t.Fatalf("error traced %v, want ct=related", tr)
			}
			unrelated := tcpPacket(ap(fam.a, 40000), ap(fam.outside, 81), syn)
			l.run(l.to, unreachable(fam.outside, fam.a, unrelated), verdictDrop)
			l.policyDrop(monitorapi.DirectionIngress, epA)

			if fam.a.Is6() {
				l.run(l.to, icmpPacket(fam.outside, fam.a, icmp6NeighSolict, 0, 0), verdictNext)
				l.trace()
				// The quoted packet's extension headers are walked:
				// the SYN behind a destination options header is
				// the allowed connection's.
				quoted := ip6With(fam.a, fam.outside, ip6Dest, syn80, ip6Ext(unix.IPPROTO_TCP, 1))
				l.run(l.to, unreachable(fam.outside, fam.a, quoted), verdictNext)
				if tr := l.trace(); tr.Flow.CTState != monitorapi.CTRelated {
					t.Fatalf("error quoting a packet with a destination options header traced %v, want ct=related", tr)
				}
				// A quoted later fragment has no ports: not related.
				frag := ip6With(fam.a, fam.outside, ip6Fragment, syn80, ip6Frag(unix.IPPROTO_TCP, 185, false, 9))
				l.run(l.to, unreachable(fam.outside, fam.a, frag), verdictDrop)
				l.policyDrop(monitorapi.DirectionIngress, epA)
			}
		})
	}
}

// TestPolicyConstantsMatchC compares pkg/policymap's constants with
// policy.h's and events.h's #defines, which BTF does not carry.
func TestPolicyConstantsMatchC(t *testing.T) {
	defines := map[string]uint64{}
	for _, file := range []string{"include/policy.h", "include/events.h"} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^#define ((?:POLICY_PREFIX|POLICY_F|TRAFFIC)_\w+) (0x)?([0-9a-f]+)`).FindAllSubmatch(src, -1) {
			base := 10
			if len(m[2]) != 0 {
				base = 16
			}
			v, err := strconv.ParseUint(string(m[3]), base, 32)
			if err != nil {
				t.Fatal(err)
			}
			defines[string(m[1])] = v
		}
	}
	want := map[string]uint64{
		"POLICY_PREFIX_IDENTITY": policymap.PrefixIdentity,
		"POLICY_PREFIX_PROTO":    policymap.PrefixProto,
		"POLICY_PREFIX_FULL":     policymap.PrefixFull,
		"POLICY_F_INGRESS":       uint64(policymap.FlagIngress),
		"POLICY_F_EGRESS":        uint64(policymap.FlagEgress),
		"TRAFFIC_INGRESS":        uint64(policymap.Ingress),
		"TRAFFIC_EGRESS":         uint64(policymap.Egress),
	}
	if fmt.Sprint(defines) != fmt.Sprint(want) {
		t.Fatalf("C defines %v, Go %v", defines, want)
	}
}

// BenchmarkLXCPolicy measures what policy costs the to-endpoint program,
// per packet, with BPF_PROG_TEST_RUN: ICMP timestamp requests, which
// conntrack does not track, so that every run decides policy again, into
// an endpoint not isolated (the baseline: one hash lookup), isolated with
// an allow of the peer's identity (one trie lookup), of an ipBlock prefix
// (a miss, a prefix trie lookup and a hit), of any peer (a miss, a prefix
// trie miss, a hit) and with none (the same, and a drop); and an
// established TCP packet into an isolated endpoint, which pays no policy
// lookup. Each with the trie holding the test endpoints' 4 entries only,
// and with 65,472 entries of 1,023 more endpoints and 1,023 more prefixes. Every run also writes its events into a ring buffer that
// nobody reads, so after the first few thousand runs they are counted as
// lost, the same cost in every case.
func BenchmarkLXCPolicy(b *testing.B) {
	for _, fill := range []int{0, 1023} {
		l := loadPolicyLXC(b)
		for ep := range fill {
			for port := range 64 {
				l.allow(policymap.Allow{EndpointID: uint16(1000 + ep), Direction: policymap.Ingress, Identity: uint32(5000 + ep),
					Proto: unix.IPPROTO_TCP, Port: uint16(1000 + port)})
			}
		}
		for i := range fill {
			l.prefix(fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256), policymap.MinPrefixID+100+uint32(i))
		}
		l.prefix("198.51.100.0/24", policymap.MinPrefixID+1)
		l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_ICMP})
		l.allow(policymap.Allow{EndpointID: epB, Direction: policymap.Ingress, Identity: policymap.MinPrefixID + 1, Proto: unix.IPPROTO_ICMP})
		l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Ingress, Proto: unix.IPPROTO_ICMP})
		l.allow(policymap.Allow{EndpointID: epA, Direction: policymap.Ingress, Identity: idZ, Proto: unix.IPPROTO_TCP, Port: 80})
		l.isolate(epA, policymap.FlagIngress)
		l.isolate(epB, policymap.FlagIngress)
		// A connection into A, established before the runs.
		l.run(l.to, tcpPacket(ap(remote, 40000), ap(podA, 80), syn), verdictNext)
		l.run(l.from, tcpPacket(ap(podA, 80), ap(remote, 40000), synAck), verdictNext)

		const icmpTimestamp = 13
		for _, tc := range []struct {
			name    string
			pkt     []byte
			verdict uint32
		}{
			{"not isolated", icmpPacket(remote, podA, icmpTimestamp, 0, 1), verdictNext},
			{"identity allow", icmpPacket(remote, podB, icmpTimestamp, 0, 1), verdictNext},
			{"any-peer allow", icmpPacket(podB, podA, icmpTimestamp, 0, 1), verdictNext},
			{"ipBlock allow", icmpPacket(netip.MustParseAddr("198.51.100.1"), podB, icmpTimestamp, 0, 1), verdictNext},
			{"denied", icmpPacket(podA, podB, icmpTimestamp, 0, 1), verdictDrop},
			{"established", tcpPacket(ap(remote, 40000), ap(podA, 80), ack), verdictNext},
		} {
			b.Run(fmt.Sprintf("entries=%d/%s", fill*64+4, tc.name), func(b *testing.B) {
				if tc.name == "not isolated" {
					// A's enforcement entry says no direction.
					l.isolate(epA, 0)
					defer l.isolate(epA, policymap.FlagIngress)
				}
				// The least of the rounds: the machine is shared.
				per := time.Duration(1 << 62)
				for b.Loop() {
					ret, d, err := l.to.Benchmark(tc.pkt, 10000, nil)
					if err != nil {
						b.Fatal(err)
					}
					if ret != tc.verdict {
						b.Fatalf("program returned %#x, want %#x", ret, tc.verdict)
					}
					per = min(per, d)
				}
				b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
			})
		}
	}
}
