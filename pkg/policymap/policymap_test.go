package policymap_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cellium/cellium/pkg/policymap"
)

func TestKeysOf(t *testing.T) {
	for _, tc := range []struct {
		name  string
		allow policymap.Allow
		want  []string
	}{
		{"any protocol", policymap.Allow{EndpointID: 7, Direction: policymap.Ingress, Identity: 1000},
			[]string{"ep 7 ingress id 1000 any"}},
		{"every port", policymap.Allow{EndpointID: 7, Direction: policymap.Egress, Proto: 17},
			[]string{"ep 7 egress id 0 proto 17"}},
		{"one port", policymap.Allow{EndpointID: 7, Direction: policymap.Ingress, Proto: 6, Port: 80},
			[]string{"ep 7 ingress id 0 proto 6 port 80-80"}},
		{"end port equal", policymap.Allow{EndpointID: 7, Direction: policymap.Ingress, Proto: 6, Port: 80, EndPort: 80},
			[]string{"ep 7 ingress id 0 proto 6 port 80-80"}},
		{"range", policymap.Allow{EndpointID: 7, Direction: policymap.Ingress, Proto: 6, Port: 8000, EndPort: 8010},
			[]string{"ep 7 ingress id 0 proto 6 port 8000-8007", "ep 7 ingress id 0 proto 6 port 8008-8009",
				"ep 7 ingress id 0 proto 6 port 8010-8010"}},
		{"to the top", policymap.Allow{EndpointID: 7, Direction: policymap.Ingress, Proto: 6, Port: 1024, EndPort: 65535},
			[]string{"ep 7 ingress id 0 proto 6 port 1024-2047", "ep 7 ingress id 0 proto 6 port 2048-4095",
				"ep 7 ingress id 0 proto 6 port 4096-8191", "ep 7 ingress id 0 proto 6 port 8192-16383",
				"ep 7 ingress id 0 proto 6 port 16384-32767", "ep 7 ingress id 0 proto 6 port 32768-65535"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := policymap.KeysOf(tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, k := range keys {
				got = append(got, k.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("keys %q, want %q", got, tc.want)
			}
		})
	}
}

// Every range is covered exactly: each port in it by one key, none
// outside it by any.
func TestKeysOfCoverRanges(t *testing.T) {
	for _, r := range [][2]uint16{{1, 65535}, {1, 1}, {65535, 65535}, {3, 1000}, {32767, 32769}, {443, 8443}} {
		keys, err := policymap.KeysOf(policymap.Allow{Direction: policymap.Ingress, Proto: 6, Port: r[0], EndPort: r[1]})
		if err != nil {
			t.Fatal(err)
		}
		covered := make([]int, 1<<16)
		for _, k := range keys {
			first := int(k.DPort[0])<<8 | int(k.DPort[1])
			size := 1 << (policymap.PrefixFull - k.PrefixLen)
			if first%size != 0 {
				t.Fatalf("range %v: key %v not aligned", r, k)
			}
			for p := first; p < first+size; p++ {
				covered[p]++
			}
		}
		for p, n := range covered {
			in := p >= int(r[0]) && p <= int(r[1])
			if (in && n != 1) || (!in && n != 0) {
				t.Fatalf("range %v: port %d covered %d times", r, p, n)
			}
		}
	}
}

func TestKeysOfRefuses(t *testing.T) {
	for _, a := range []policymap.Allow{
		{Direction: 3, Proto: 6},
		{Direction: policymap.Ingress, Port: 80},
		{Direction: policymap.Ingress, Proto: 6, EndPort: 80},
		{Direction: policymap.Ingress, Proto: 6, Port: 81, EndPort: 80},
	} {
		if keys, err := policymap.KeysOf(a); err == nil {
			t.Errorf("KeysOf(%+v) = %v, want an error", a, keys)
		}
	}
}

// PrefixID is a function of the prefix alone, in the range, and takes the
// next free ID on a collision.
func TestPrefixID(t *testing.T) {
	none := func(uint32) bool { return false }
	a := policymap.PrefixID(netip.MustParsePrefix("10.0.0.0/8"), none)
	if !policymap.IsPrefixID(a) || a != policymap.PrefixID(netip.MustParsePrefix("10.1.2.3/8"), none) {
		t.Fatalf("10.0.0.0/8 = %d, not in range or not the same for 10.1.2.3/8", a)
	}
	if b := policymap.PrefixID(netip.MustParsePrefix("10.0.0.0/9"), none); b == a {
		t.Fatalf("10.0.0.0/8 and /9 both %d", a)
	}
	if c := policymap.PrefixID(netip.MustParsePrefix("10.0.0.0/8"), func(id uint32) bool { return id == a }); c == a || !policymap.IsPrefixID(c) {
		t.Fatalf("with %d taken, 10.0.0.0/8 = %d", a, c)
	}
}
