package etcdtest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestLaunchReportsPortTaken: etcd exiting at start because its client
// port is taken is errPortTaken, which the first start answers with other
// ports, and the server is left stopped.
func TestLaunchReportsPortTaken(t *testing.T) {
	bin, err := Binary()
	if err != nil {
		t.Skip(err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	s := &Server{t: t, bin: bin, dir: t.TempDir(), client: "http://" + taken.Addr().String(), peer: "http://" + freeAddr(t), name: "etcdtest-port"}
	t.Cleanup(s.Stop)
	if err := s.launch(); !errors.Is(err, errPortTaken) {
		t.Fatalf("launch on a taken port = %v, want errPortTaken", err)
	}
	if s.cmd != nil {
		t.Errorf("the server is not left stopped after etcd exited")
	}
}

// TestFreeAddrBelowEphemeralRange: the ports chosen are below the range
// the kernel gives listeners on port 0 and outgoing connections.
func TestFreeAddrBelowEphemeralRange(t *testing.T) {
	for range 20 {
		addr, err := net.ResolveTCPAddr("tcp", freeAddr(t))
		if err != nil {
			t.Fatal(err)
		}
		if addr.Port < 20000 || addr.Port >= 32768 {
			t.Fatalf("freeAddr chose port %d, want 20000-32767", addr.Port)
		}
	}
}

// TestHealthyAsksWhoAnswers: another etcd answering on a server's client
// port (one that took the port before this server's etcd could bind it)
// is not taken for the server: the health check asks the member's name.
func TestHealthyAsksWhoAnswers(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !s.healthy(ctx) {
		t.Fatalf("the server is not healthy; log: %s", s.Log())
	}
	other := &Server{t: t, client: s.client, name: "etcdtest-someone-else"}
	if other.healthy(ctx) {
		t.Errorf("a server named %q is healthy on the port of the etcd named %q", other.name, s.name)
	}
}
