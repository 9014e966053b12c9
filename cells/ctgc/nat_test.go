package ctgc_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctgc"
	"github.com/cellium/cellium/pkg/ctmap"
	"github.com/cellium/cellium/pkg/lbmap"
	"github.com/cellium/cellium/pkg/nodeportmap"
)

// natMax is the NodePort NAT map's size in the tests.
const natMax = 4096

// natConn is a NodePort connection to a remote backend, whose two NAT
// entries the test puts in the map as the datapath writes them.
type natConn struct {
	n       int
	expired bool
}

func (c natConn) entries(now uint32) map[nodeportmap.Key4]nodeportmap.NAT4 {
	client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(c.n >> 8)}), uint16(40000+c.n))
	fe := netip.MustParseAddrPort("10.90.0.11:30080")
	backend := netip.MustParseAddrPort("10.244.1.2:8080")
	snat := netip.AddrPortFrom(fe.Addr(), uint16(61000+c.n))
	lifetime := now + 3600
	if c.expired {
		lifetime = now - 30
	}
	in, out := nodeportmap.NewSNAT4(backend, 1, snat), nodeportmap.NewSNAT4(fe, 1, client)
	in.Lifetime, out.Lifetime = lifetime, lifetime
	in.State, out.State = nodeportmap.StateReply, nodeportmap.StateReply
	inKey := nodeportmap.NewKey4(lbmap.TCP, client, fe, nodeportmap.DirIn)
	return map[nodeportmap.Key4]nodeportmap.NAT4{inKey: in, nodeportmap.PairKey(inKey, in): out}
}

func natConns(from, n int, expired bool) []natConn {
	out := make([]natConn, n)
	for i := range out {
		out[i] = natConn{n: from + i, expired: expired}
	}
	return out
}

func (e *gcEnv) putNAT(conns ...natConn) {
	e.t.Helper()
	now := ctmap.Now()
	for _, c := range conns {
		for k, v := range c.entries(now) {
			if err := e.nat.Put(k, v); err != nil {
				e.t.Fatalf("put %v: %v", k, err)
			}
		}
	}
}

// checkNAT fails the test unless both entries of each kept conn are in the
// map and neither of each gone one.
func (e *gcEnv) checkNAT(when string, kept, gone []natConn) {
	e.t.Helper()
	for want, conns := range map[bool][]natConn{true: kept, false: gone} {
		for _, c := range conns {
			for k := range c.entries(0) {
				_, err := e.nat.Lookup(k)
				if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					e.t.Fatal(err)
				}
				if has := err == nil; has != want {
					e.t.Errorf("%s: NAT entry %v of %+v there: %v, want %v", when, k, c, has, want)
				}
			}
		}
	}
}

// TestNATExpiredEntriesGoLiveOnesStay: a pass deletes both entries of the
// NodePort connections that expired and keeps those of live ones, counts
// them in its figures and the metrics; a flush leaves the NAT map alone.
func TestNATExpiredEntriesGoLiveOnesStay(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{nat: true})
	live, dead := natConns(0, 20, false), natConns(100, 30, true)
	e.putNAT(live...)
	e.putNAT(dead...)

	p := e.run()
	if p.Err != nil {
		t.Fatal(p.Err)
	}
	e.checkNAT("after a pass", live, dead)
	m := mapPass(t, p, nodeportmap.MapName)
	if m.Scanned != 2*(20+30) || m.Expired != 2*30 || m.Capacity != natMax {
		t.Errorf("%s: %+v, want %d scanned, %d expired, capacity %d", nodeportmap.MapName, m, 2*(20+30), 2*30, natMax)
	}
	if got := metric(t, e.registry, "cellium_ct_gc_entries_deleted_total", "map", nodeportmap.MapName, "reason", "expired"); got != 2*30 {
		t.Errorf("cellium_ct_gc_entries_deleted_total{map=%s,reason=expired} = %v, want %d", nodeportmap.MapName, got, 2*30)
	}

	if _, err := e.gc.Flush(); err != nil {
		t.Fatal(err)
	}
	e.checkNAT("after a flush", live, nil)
}

// TestNATPassOverManyChunks: a NAT map of thousands of entries, walked in
// small chunks, loses exactly its expired entries.
func TestNATPassOverManyChunks(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{nat: true})
	ctgc.SetChunkSize(e.gc, 64)
	live, dead := natConns(0, 700, false), natConns(1000, 900, true)
	e.putNAT(live...)
	e.putNAT(dead...)
	p := e.run()
	if p.Err != nil {
		t.Fatal(p.Err)
	}
	e.checkNAT("after a pass", live, dead)
	if m := mapPass(t, p, nodeportmap.MapName); m.Expired != 2*900 {
		t.Errorf("%s: %+v, want %d expired", nodeportmap.MapName, m, 2*900)
	}
}
