package devcluster_test

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
)

// serveUDPSeen answers every datagram to port in the namespace at nsPath
// with "seen <address>", the sender's address as the server sees it.
func serveUDPSeen(t *testing.T, nsPath string, port uint16) {
	t.Helper()
	var pc net.PacketConn
	err := nettest.Do(nsPath, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			addr := netip.MustParseAddrPort(from.String()).Addr().Unmap()
			pc.WriteTo([]byte("seen "+addr.String()), from)
		}
	}()
}

// udpSeenAs sends a datagram from the namespace at nsPath to to, on a
// connected socket, which takes replies from to alone, and returns what
// the answer says.
func udpSeenAs(nsPath string, to netip.AddrPort) string {
	var c net.Conn
	err := nettest.Do(nsPath, func() error {
		var err error
		c, err = net.Dial("udp4", to.String())
		return err
	})
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	buf := make([]byte, 1500)
	// A datagram may be lost before the first one set up the path
	// (neighbour resolution): a few tries.
	for range 5 {
		if _, err := c.Write([]byte("ping")); err != nil {
			return "write: " + err.Error()
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			return strings.TrimPrefix(string(buf[:n]), "seen ")
		}
	}
	return "no answer"
}

// TestNodePortFromOutside: on a two-node dev-cluster, a client outside the
// cluster (the outside namespace) reaches a NodePort Service at node-1's
// address whose backend is a pod on node-1, over TCP and UDP; the backend
// sees the client's own address, and the replies come back from node-1's
// address and NodePort (the client's TCP handshake and its connected UDP
// socket would take nothing else).
func TestNodePortFromOutside(t *testing.T) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2})
	web := c.AddPod("node-1", "web", map[string]string{"app": "web"})
	out := c.AddOutside()
	n1 := c.Node("node-1")
	serveSeen(t, web.NetNS, 8080, false)
	serveUDPSeen(t, web.NetNS, 8053)
	c.WriteManifest("web.yaml", fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.61
  ports:
  - {name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}
  - {name: dns, port: 53, targetPort: 8053, nodePort: 30053, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}, {name: dns, port: 8053, protocol: UDP}]
endpoints:
- addresses: [%s]
  conditions: {ready: true}
`, web.IPv4))
	c.WaitService("node-1", "default", "web")

	t.Run("TCP", func(t *testing.T) {
		to := netip.AddrPortFrom(n1.IPv4, 30080)
		deadline := time.Now().Add(10 * time.Second)
		for {
			got := seenAs(t, devcluster.Pod{NetNS: out.NetNS}, to)
			if got == out.IPv4.String() {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("outside -> node-1 %s (backend web on node-1): seen as %q, want the client's %s", to, got, out.IPv4)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("UDP", func(t *testing.T) {
		to := netip.AddrPortFrom(n1.IPv4, 30053)
		if got := udpSeenAs(out.NetNS, to); got != out.IPv4.String() {
			t.Fatalf("outside -> node-1 %s/udp (backend web on node-1): answer %q, want the client's %s", to, got, out.IPv4)
		}
	})
}
