package masquerade

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"

	"github.com/cellium/cellium/pkg/nettest"
)

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestMerge(t *testing.T) {
	got := merge(pfx("10.0.0.0/8", "10.1.0.0/24", "192.168.0.0/25", "192.168.0.128/25", "10.90.0.11/32"))
	want := []span{
		{netip.MustParseAddr("10.0.0.0"), netip.MustParseAddr("10.255.255.255")},
		{netip.MustParseAddr("192.168.0.0"), netip.MustParseAddr("192.168.0.255")},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("merge: %v, want %v", got, want)
	}
}

// kernelIn is a Kernel in a namespace of the test's own.
func kernelIn(t *testing.T) (*Kernel, func() *nftables.Conn) {
	t.Helper()
	n := nettest.NewNS(t)
	k := NewKernel(int(n.Fd()))
	return k, func() *nftables.Conn {
		c, err := k.conn()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}

func TestKernelSync(t *testing.T) {
	k, conn := kernelIn(t)
	want := Ruleset{
		Enabled: true,
		V4:      Want{Source: pfx("10.244.1.0/24"), Excluded: pfx("10.244.1.0/24", "10.244.2.0/24", "10.90.0.11/32", "10.90.0.12/32")},
		V6:      Want{Source: pfx("fd00:10:244:1::/64"), Excluded: pfx("fd00:10:244::/48", "fd00:10:90::11/128")},
	}
	changed, err := k.Sync(want)
	if err != nil || len(changed) == 0 {
		t.Fatalf("first sync: %v %v, want the table created", changed, err)
	}
	changed, err = k.Sync(want)
	if err != nil || len(changed) != 0 {
		t.Fatalf("second sync of the same: changed %v, err %v; want nothing written", changed, err)
	}
	c := conn()
	sets, err := c.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		els, _ := c.GetSetElements(s)
		t.Logf("set %s: %v", s.Name, els)
	}
}
