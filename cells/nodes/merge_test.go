package nodes

import (
	"net/netip"
	"testing"
)

// The kvstore's keys come in batches. Rows merged before the last one
// (claims.listing) hold no pod CIDR: a key read first must not hold a CIDR
// that an older key of another node, read in a later batch, has the
// stronger claim on. Once listed, the rows' CIDRs are held, and a newcomer
// cannot take one, however old its key says it is.
func TestClaimsHoldNothingWhileListing(t *testing.T) {
	cidr := netip.MustParsePrefix("10.200.1.0/24")
	spec := Spec{Addresses: []Address{{Type: InternalIP, IP: netip.MustParseAddr("192.0.2.1")}}, PodCIDRs: []netip.Prefix{cidr}}
	owner := func(c *claims) string {
		t.Helper()
		var who []string
		for name, n := range c.rows() {
			if len(n.PodCIDRs) == 1 && n.PodCIDRs[0] == cidr {
				who = append(who, name)
			}
		}
		if len(who) != 1 {
			t.Fatalf("%s held by %v, want one node", cidr, who)
		}
		return who[0]
	}

	c := newClaims("local", true)
	// The first batch: the key that sorts first, created later.
	c.setCreated("node-a", 20)
	c.set("node-a", SourceKVStore, spec, true)
	if got := owner(c); got != "node-a" {
		t.Fatalf("first batch: %s held by %s, want node-a, its only claimant", cidr, got)
	}
	// The second batch: an older key with the same CIDR.
	c.setCreated("node-b", 10)
	c.set("node-b", SourceKVStore, spec, true)
	c.listed()
	if got := owner(c); got != "node-b" {
		t.Fatalf("listed: %s held by %s, want node-b, whose key is older (a row of a partial listing held it)", cidr, got)
	}

	// Listed: a newcomer whose key says it is older still cannot take it.
	c.setCreated("node-0", 5)
	c.set("node-0", SourceKVStore, spec, true)
	if got := owner(c); got != "node-b" {
		t.Fatalf("after the listing: %s taken by %s, want it kept by node-b, which held it", cidr, got)
	}
}
