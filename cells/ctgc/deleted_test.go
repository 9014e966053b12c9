package ctgc_test

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctgc"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/pkg/ctmap"
)

// TestDeletedEndpointsEntriesFlushed: when an endpoint is deleted while
// the agent runs, the live conntrack entries with its addresses, as source
// or destination, in the TCP and other maps of both families, are deleted
// at once (the IPAM gives the address to a new pod later): an established
// entry of a peer's connection to the old pod would let the peer's packets
// into the new one past its ingress policy. The entries of other endpoints
// stay.
func TestDeletedEndpointsEntriesFlushed(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{})
	pod := func(id uint16, v4, v6 string) *endpointmanager.Endpoint {
		ep := testEndpoint(id)
		ep.IPv4, ep.IPv6 = netip.MustParseAddr(v4), netip.MustParseAddr(v6)
		return ep
	}
	gone, stays := pod(7, "10.244.0.7", "fd00::7"), pod(8, "10.244.0.8", "fd00::8")
	txn := e.db.WriteTxn(e.endpoints)
	e.endpoints.Insert(txn, gone)
	e.endpoints.Insert(txn, stays)
	txn.Commit()

	// Entries of each endpoint: its own connection out, a peer's
	// connection in (an established TCP entry, no FIN or RST seen), in
	// each map; and one between two other addresses.
	now := ctmap.Now()
	live := ctmap.Entry{Lifetime: now + 21600, Flags: ctmap.CTFSynSeen | ctmap.CTFEstablished}
	peer4, peer6 := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00:1::5")
	keys4 := func(ep *endpointmanager.Endpoint) []ctmap.Key4 {
		var out []ctmap.Key4
		for _, proto := range []uint8{6, 17} {
			out = append(out,
				ctmap.Key4{SrcAddr: ep.IPv4.As4(), DstAddr: peer4.As4(), SrcPort: [2]byte{0x9c, 0x40}, DstPort: [2]byte{0, 80}, Proto: proto},
				ctmap.Key4{SrcAddr: peer4.As4(), DstAddr: ep.IPv4.As4(), SrcPort: [2]byte{0x9c, 0x41}, DstPort: [2]byte{0x1f, 0x90}, Proto: proto})
		}
		return out
	}
	keys6 := func(ep *endpointmanager.Endpoint) []ctmap.Key6 {
		var out []ctmap.Key6
		for _, proto := range []uint8{6, 17} {
			out = append(out,
				ctmap.Key6{SrcAddr: ep.IPv6.As16(), DstAddr: peer6.As16(), SrcPort: [2]byte{0x9c, 0x40}, DstPort: [2]byte{0, 80}, Proto: proto},
				ctmap.Key6{SrcAddr: peer6.As16(), DstAddr: ep.IPv6.As16(), SrcPort: [2]byte{0x9c, 0x41}, DstPort: [2]byte{0x1f, 0x90}, Proto: proto})
		}
		return out
	}
	map4 := func(k ctmap.Key4) *ctmaps.Map4 {
		if k.Proto == 6 {
			return e.maps.TCP4
		}
		return e.maps.Any4
	}
	map6 := func(k ctmap.Key6) *ctmaps.Map6 {
		if k.Proto == 6 {
			return e.maps.TCP6
		}
		return e.maps.Any6
	}
	put := func(ep *endpointmanager.Endpoint) {
		for _, k := range keys4(ep) {
			v := live
			v.EndpointID = ep.ID
			if err := map4(k).Put(k, v); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range keys6(ep) {
			v := live
			v.EndpointID = ep.ID
			if err := map6(k).Put(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	// has says how many of ep's entries are in the maps.
	has := func(ep *endpointmanager.Endpoint) int {
		n := 0
		for _, k := range keys4(ep) {
			if _, err := map4(k).Lookup(k); err == nil {
				n++
			}
		}
		for _, k := range keys6(ep) {
			if _, err := map6(k).Lookup(k); err == nil {
				n++
			}
		}
		return n
	}
	put(gone)
	put(stays)

	txn = e.db.WriteTxn(e.endpoints)
	e.endpoints.Delete(txn, gone)
	txn.Commit()
	e.waitStatus("endpoint 7's entries deleted", func(s ctgc.Status) bool { return s.EndpointsFlushed >= 1 })
	if n := has(gone); n != 0 {
		t.Errorf("%d of the 8 entries of deleted endpoint 7 (%s, %s) are still there", n, gone.IPv4, gone.IPv6)
	}
	if n := has(stays); n != 8 {
		t.Errorf("%d of the 8 entries of endpoint 8, which stays, are there, want all", n)
	}
	var total float64
	for _, m := range []string{"cellium_ct4_tcp", "cellium_ct4_any", "cellium_ct6_tcp", "cellium_ct6_any"} {
		got := metric(t, e.registry, "cellium_ct_gc_entries_deleted_total", "map", m, "reason", "endpoint_deleted")
		if got != 2 {
			t.Errorf("cellium_ct_gc_entries_deleted_total{map=%s,reason=endpoint_deleted} = %v, want 2", m, got)
		}
		total += got
	}
	if total != 8 {
		t.Errorf("%v entries counted deleted for deleted endpoints, want 8", total)
	}
}
