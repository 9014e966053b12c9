package masquerade

import (
	"net/netip"
	"slices"
	"strings"
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

// TestKernelSync: the table is written, then nothing is written again; a
// rule or set element changed by someone else is put right, and only it.
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

	// A rule removed by someone else is written again, and only the rules.
	c := conn()
	chain, err := c.ListChain(table, ChainName)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(table, chain)
	if err != nil || len(rules) != 2 {
		t.Fatalf("rules: %d (%v), want 2", len(rules), err)
	}
	if err := c.DelRule(rules[1]); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	changed, err = k.Sync(want)
	if err != nil || !slices.Equal(changed, []string{"rules of chain " + ChainName}) {
		t.Fatalf("sync after a rule was removed: %v %v, want the rules written", changed, err)
	}
	rules, _ = c.GetRules(table, chain)
	var tags []string
	for _, r := range rules {
		tags = append(tags, string(r.UserData))
	}
	if !slices.Equal(tags, []string{"cellium-masquerade-v4-v1", "cellium-masquerade-v6-v1"}) {
		t.Fatalf("rules after the sync: %v", tags)
	}

	// A set changed by someone else is refilled.
	if err := c.SetAddElements(&nftables.Set{Table: table, Name: "nomasq4", KeyType: nftables.TypeIPAddr, Interval: true},
		elements(pfx("172.16.0.0/12"), 4)); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	changed, err = k.Sync(want)
	if err != nil || len(changed) != 1 || !strings.HasPrefix(changed[0], "set nomasq4") {
		t.Fatalf("sync after an element was added: %v %v, want set nomasq4 refilled", changed, err)
	}
	if changed, err := k.Sync(want); err != nil || len(changed) != 0 {
		t.Fatalf("sync again: %v %v, want nothing", changed, err)
	}
}
