package ipcachemap

import (
	"net/netip"
	"testing"
)

func TestKeyRoundTrip(t *testing.T) {
	for _, s := range []string{"10.0.1.0/24", "10.0.1.7/32", "0.0.0.0/0", "fd00::/64", "::/0"} {
		p := netip.MustParsePrefix(s)
		if got := KeyOf(p).Prefix(); got != p {
			t.Errorf("KeyOf(%s).Prefix() = %s", p, got)
		}
	}
	if k := KeyOf(netip.MustParsePrefix("10.0.1.7/24")); k.Prefix().String() != "10.0.1.0/24" {
		t.Errorf("KeyOf does not mask: %s", k.Prefix())
	}
	var v Value
	for _, s := range []string{"192.168.0.2", "fd00::2"} {
		v.SetTunnelEndpoint(netip.MustParseAddr(s))
		if v.TunnelAddr().String() != s {
			t.Errorf("tunnel endpoint %s read back as %s", s, v.TunnelAddr())
		}
	}
	v.SetTunnelEndpoint(netip.Addr{})
	if v.TunnelAddr().IsValid() || v.TunnelFamily != 0 {
		t.Errorf("clearing the tunnel endpoint left %v", v)
	}
}
