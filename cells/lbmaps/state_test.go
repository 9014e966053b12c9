package lbmaps

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/cellium/cellium/cells/loadbalancer"
)

// An addrMap holds IPv4 and IPv6 keys apart, gives back what was set under
// each key, and lists every entry with its key as keyOf made it.
func TestAddrMap(t *testing.T) {
	m := newAddrMap[int]()
	want := map[addrKey]int{}
	for i, s := range []string{
		"10.96.0.10:53/UDP", "10.96.0.10:53/TCP", "10.96.0.10:80/TCP", "0.0.0.0:30080/TCP",
		"[fd00::10]:53/UDP", "[::ffff:10.96.0.11]:80/TCP", "[::]:30080/TCP", "255.255.255.255:65535/UDP",
	} {
		a, err := loadbalancer.ParseL3n4Addr(s)
		if err != nil {
			t.Fatal(err)
		}
		k, ok := keyOf(a)
		if !ok {
			t.Fatalf("%s: no key", s)
		}
		m.set(k, i)
		want[k] = i
	}
	if len(m.v4) != 6 || len(m.v6) != 2 {
		t.Errorf("%d IPv4 and %d IPv6 entries, want 6 and 2 (an IPv4-mapped address is IPv4)", len(m.v4), len(m.v6))
	}
	for k, v := range want {
		if got, ok := m.get(k); !ok || got != v {
			t.Errorf("get %s:%d = %d, %v; want %d", k.ip(), k.port, got, ok, v)
		}
	}
	if got := maps.Collect(m.all()); !maps.Equal(got, want) {
		t.Errorf("all() = %v, want %v", got, want)
	}

	for _, a := range []loadbalancer.L3n4Addr{
		{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: loadbalancer.UDP},
		{Addr: netip.MustParseAddr("10.96.0.11"), Port: 53, Protocol: loadbalancer.UDP},
		{Addr: netip.MustParseAddr("fd00::10"), Port: 53, Protocol: loadbalancer.TCP},
	} {
		k, _ := keyOf(a)
		if _, ok := m.get(k); ok {
			t.Errorf("%s found, never set", a)
		}
	}
	for k := range want {
		m.delete(k)
		delete(want, k)
		if _, ok := m.get(k); ok {
			t.Fatalf("%s:%d still there after delete", k.ip(), k.port)
		}
		if got := maps.Collect(m.all()); !maps.Equal(got, want) {
			t.Fatalf("after deleting %s:%d, all() = %v, want %v", k.ip(), k.port, got, want)
		}
	}
}
