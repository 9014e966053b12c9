package socklbtest_test

import (
	"net/netip"
	"testing"

	"github.com/cellium/cellium/cells/loader/socklbtest"
)

func TestMain(m *testing.M) { socklbtest.Main(m) }

// Without programs, the harness's clients reach the backends directly, and
// anything else fails inside the namespace: nothing can leave the machine.
func TestHarnessWithoutPrograms(t *testing.T) {
	env := socklbtest.New(t)
	backend := netip.MustParseAddrPort("127.0.0.2:9000")
	env.ServeTCP(backend)
	env.ServeUDP(backend)

	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: backend},
		socklbtest.Call{Op: socklbtest.UDP, To: backend},
		socklbtest.Call{Op: socklbtest.UDPConnected, To: backend},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.MustParseAddrPort("10.96.0.10:80")},
		socklbtest.Call{Op: socklbtest.UDP, To: netip.MustParseAddrPort("10.96.0.10:53")},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.MustParseAddrPort("127.0.0.3:9000")},
	)
	if r[0].Backend != backend.String() || r[0].Peer != backend {
		t.Errorf("%v; want the backend as backend and peer", r[0])
	}
	for _, res := range r[1:3] {
		if res.Backend != backend.String() || res.From != backend {
			t.Errorf("%v; want the backend's answer from the backend", res)
		}
	}
	if r[3].Failed != "connect" || r[3].Errno != "ENETUNREACH" {
		t.Errorf("%v; want ENETUNREACH: the namespace has no route out", r[3])
	}
	if r[4].Failed != "send" || r[4].Errno != "ENETUNREACH" {
		t.Errorf("%v; want ENETUNREACH: the namespace has no route out", r[4])
	}
	if r[5].Failed != "connect" || r[5].Errno != "ECONNREFUSED" {
		t.Errorf("%v; want ECONNREFUSED from a loopback address nobody listens on", r[5])
	}
}

func TestHarnessIPv6(t *testing.T) {
	env := socklbtest.New(t)
	env.RequireIPv6()
	backend := netip.MustParseAddrPort("[fd00:10::1]:9000")
	env.AddAddr(netip.PrefixFrom(backend.Addr(), 128))
	env.ServeTCP(backend)
	r := env.Run(
		socklbtest.Call{Op: socklbtest.TCP, To: backend},
		socklbtest.Call{Op: socklbtest.TCP, To: netip.MustParseAddrPort("[fd00:96::10]:80")},
	)
	if r[0].Backend != backend.String() || r[0].Peer != backend {
		t.Errorf("%v; want the backend as backend and peer", r[0])
	}
	if r[1].Errno != "ENETUNREACH" {
		t.Errorf("%v; want ENETUNREACH", r[1])
	}
}
