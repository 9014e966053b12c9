package addrmap

import (
	"maps"
	"net/netip"
	"testing"
)

const (
	tcp = 6
	udp = 17
)

// A Map holds IPv4 and IPv6 keys apart (an IPv4-mapped address is IPv4),
// gives back what was set under each key, lists every entry with its key
// as KeyOf made it, and forgets what is deleted, also while listing.
func TestMap(t *testing.T) {
	m := New[int]()
	want := map[Key]int{}
	for i, c := range []struct {
		addr  string
		proto uint8
	}{
		{"10.96.0.10:53", udp}, {"10.96.0.10:53", tcp}, {"10.96.0.10:80", tcp}, {"0.0.0.0:30080", tcp},
		{"[fd00::10]:53", udp}, {"[::ffff:10.96.0.11]:80", tcp}, {"[::]:30080", tcp}, {"255.255.255.255:65535", udp},
	} {
		ap := netip.MustParseAddrPort(c.addr)
		k := KeyOf(ap.Addr(), ap.Port(), c.proto)
		if got := k.IP(); got != ap.Addr().Unmap() || k.Port != ap.Port() || k.Proto != c.proto {
			t.Errorf("KeyOf(%s, %d) gives back %s:%d proto %d", c.addr, c.proto, got, k.Port, k.Proto)
		}
		m.Set(k, i)
		want[k] = i
	}
	if len(m.v4) != 6 || len(m.v6) != 2 || m.Len() != 8 {
		t.Errorf("%d IPv4 and %d IPv6 entries (Len %d), want 6 and 2", len(m.v4), len(m.v6), m.Len())
	}
	for k, v := range want {
		if got, ok := m.Get(k); !ok || got != v {
			t.Errorf("Get %s:%d = %d, %v; want %d", k.IP(), k.Port, got, ok, v)
		}
	}
	if got := maps.Collect(m.All()); !maps.Equal(got, want) {
		t.Errorf("All() = %v, want %v", got, want)
	}
	for _, k := range []Key{
		KeyOf(netip.MustParseAddr("10.96.0.10"), 80, udp),
		KeyOf(netip.MustParseAddr("10.96.0.11"), 53, udp),
		KeyOf(netip.MustParseAddr("fd00::10"), 53, tcp),
	} {
		if _, ok := m.Get(k); ok {
			t.Errorf("%s:%d/%d found, never set", k.IP(), k.Port, k.Proto)
		}
	}
	for k := range m.All() {
		m.Delete(k)
		delete(want, k)
		if _, ok := m.Get(k); ok {
			t.Fatalf("%s:%d still there after Delete", k.IP(), k.Port)
		}
	}
	if m.Len() != 0 || len(want) != 0 {
		t.Errorf("%d entries left after deleting every one while listing", m.Len())
	}
}
