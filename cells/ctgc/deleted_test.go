package ctgc_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctgc"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/ctmap"
)

// TestDeletedEndpointsEntriesFlushed: in a hive without the IPAM, when an
// endpoint is deleted while the agent runs, the live conntrack entries with
// its addresses, as source or destination, in the TCP and other maps of
// both families, are deleted at once: an established entry of a peer's
// connection to the old pod would let the peer's packets into the next pod
// given the address past its ingress policy. The entries of other
// endpoints stay.
func TestDeletedEndpointsEntriesFlushed(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{})
	// The job sees the deletions after it follows the table: one before
	// is not a change it is given.
	e.waitHealth("ct-gc.job-flush-deleted-endpoints", "Following deleted endpoints")
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

	put := func(ep *endpointmanager.Endpoint) { podConns{ep.IPv4, ep.IPv6}.put(t, e, ep.ID) }
	has := func(ep *endpointmanager.Endpoint) int { return podConns{ep.IPv4, ep.IPv6}.has(e) }
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

// podConns are the conntrack entries of a pod's addresses: its own
// connection out and a peer's connection in (an established TCP entry, no
// FIN or RST seen), TCP and UDP, in each family: 8 entries.
type podConns struct{ v4, v6 netip.Addr }

var peer4, peer6 = netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00:1::5")

func (p podConns) keys4() []ctmap.Key4 {
	var out []ctmap.Key4
	for _, proto := range []uint8{6, 17} {
		out = append(out,
			ctmap.Key4{SrcAddr: p.v4.As4(), DstAddr: peer4.As4(), SrcPort: [2]byte{0x9c, 0x40}, DstPort: [2]byte{0, 80}, Proto: proto},
			ctmap.Key4{SrcAddr: peer4.As4(), DstAddr: p.v4.As4(), SrcPort: [2]byte{0x9c, 0x41}, DstPort: [2]byte{0x1f, 0x90}, Proto: proto})
	}
	return out
}

func (p podConns) keys6() []ctmap.Key6 {
	var out []ctmap.Key6
	for _, proto := range []uint8{6, 17} {
		out = append(out,
			ctmap.Key6{SrcAddr: p.v6.As16(), DstAddr: peer6.As16(), SrcPort: [2]byte{0x9c, 0x40}, DstPort: [2]byte{0, 80}, Proto: proto},
			ctmap.Key6{SrcAddr: peer6.As16(), DstAddr: p.v6.As16(), SrcPort: [2]byte{0x9c, 0x41}, DstPort: [2]byte{0x1f, 0x90}, Proto: proto})
	}
	return out
}

// put writes p's entries, live for 6 hours, of endpoint id.
func (p podConns) put(t *testing.T, e *gcEnv, id uint16) {
	t.Helper()
	live := ctmap.Entry{Lifetime: ctmap.Now() + 21600, Flags: ctmap.CTFSynSeen | ctmap.CTFEstablished, EndpointID: id}
	for _, k := range p.keys4() {
		if err := e.ctMap4(conn{tcp: k.Proto == 6}).Put(k, live); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range p.keys6() {
		if err := e.ctMap6(conn{tcp: k.Proto == 6}).Put(k, live); err != nil {
			t.Fatal(err)
		}
	}
}

// has is how many of p's entries are in the maps; of addr's only, when
// given.
func (p podConns) has(e *gcEnv, addr ...netip.Addr) int {
	n := 0
	for _, k := range p.keys4() {
		if _, err := e.ctMap4(conn{tcp: k.Proto == 6}).Lookup(k); err == nil && (len(addr) == 0 || slices.Contains(addr, p.v4)) {
			n++
		}
	}
	for _, k := range p.keys6() {
		if _, err := e.ctMap6(conn{tcp: k.Proto == 6}).Lookup(k); err == nil && (len(addr) == 0 || slices.Contains(addr, p.v6)) {
			n++
		}
	}
	return n
}

// TestReleasedAddressHeldUntilEntriesGone: with the IPAM in the hive, an
// address its owner releases (an endpoint deleted) goes to no one until the
// conntrack entries with it are deleted: whenever an allocation of it
// succeeds, none of the old owner's entries is left. Entries of other
// addresses stay.
func TestReleasedAddressHeldUntilEntriesGone(t *testing.T) {
	e := newGCEnv(t, bpfmapstest.Root(t), envOptions{ipam: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alloc := func(owner string) podConns {
		var p podConns
		for _, f := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
			a, err := e.ipam.Allocate(ctx, ipam.Request{Owner: owner, Family: f})
			if err != nil {
				t.Fatal(err)
			}
			if f == ipam.IPv4 {
				p.v4 = a.IP
			} else {
				p.v6 = a.IP
			}
		}
		return p
	}
	old, other := alloc("container-7"), alloc("container-8")
	old.put(t, e, 7)
	other.put(t, e, 8)

	released, err := e.ipam.ReleaseOwner("container-7")
	if err != nil || len(released) != 2 {
		t.Fatalf("release: %v, %v; want both addresses", released, err)
	}
	refused := 0
	for _, addr := range released {
		for {
			_, err := e.ipam.Allocate(ctx, ipam.Request{Owner: "container-9", IP: addr})
			if err == nil {
				break
			}
			if !errors.Is(err, ipam.ErrInUse) {
				t.Fatalf("allocate %s again: %v", addr, err)
			}
			refused++
			held, watch := e.ipam.Releasing()
			if !slices.Contains(held, addr) {
				continue
			}
			select {
			case <-watch:
			case <-ctx.Done():
				t.Fatalf("%s still held as released: %v", addr, ctx.Err())
			}
		}
		if n := old.has(e, addr); n != 0 {
			t.Errorf("%s handed out again with %d of its old owner's conntrack entries left", addr, n)
		}
	}
	t.Logf("allocations refused while the addresses were held: %d", refused)
	if n := other.has(e); n != 8 {
		t.Errorf("%d of the 8 entries of another pod's addresses are left, want all", n)
	}
	st, _ := e.gc.Status()
	if st.AddressesReleased != 2 {
		t.Errorf("status: %d addresses released, want 2", st.AddressesReleased)
	}
	var total float64
	for _, m := range []string{"cellium_ct4_tcp", "cellium_ct4_any", "cellium_ct6_tcp", "cellium_ct6_any"} {
		total += metric(t, e.registry, "cellium_ct_gc_entries_deleted_total", "map", m, "reason", "endpoint_deleted")
	}
	if total != 8 {
		t.Errorf("%v entries counted deleted for released addresses, want 8", total)
	}
}

// waitHealth waits until the health row id's message is msg.
func (e *gcEnv) waitHealth(id, msg string) {
	e.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		s, _, watch, _ := e.health.GetWatch(e.db.ReadTxn(), health.StatusID.Query(id))
		if s != nil && s.Message == msg {
			return
		}
		select {
		case <-watch:
		case <-timeout:
			e.t.Fatalf("health row %s never said %q; last: %+v", id, msg, s)
		}
	}
}
