package devcluster_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// TestNodePortDSR: on a two-node dev-cluster whose agents run with
// --lb-mode=dsr (tunnel and native routing), a client outside the cluster
// reaches a NodePort Service at node-1's address whose backend is a pod on
// node-2, over TCP and UDP, and the backend sees the client's own address:
// node-1 did not translate the source, so the reply cannot come back
// through it (node-1 has nothing that would translate it back), and
// node-2 sent it to the client directly. The client's TCP handshake and
// its connected UDP socket take replies from node-1's address and NodePort
// alone, so they prove that node-2 sent them from the frontend, and that
// node-2's masquerade left them alone (it would give them node-2's
// address). The TCP connection then carries data both ways, a line larger
// than a packet too. The packets reach the backend pod with the DSR option
// still in them (a capture in the pod's namespace): its stack ignores
// the option. With --lb-mode=snat the backend would see node-1. A local
// backend, and externalTrafficPolicy: Local, are as in snat mode.
func TestNodePortDSR(t *testing.T) {
	for _, mode := range []string{"tunnel", "native"} {
		t.Run(mode, func(t *testing.T) { nodePortDSR(t, mode) })
	}
}

func nodePortDSR(t *testing.T, mode string) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, RoutingMode: mode, AgentArgs: []string{"--lb-mode=dsr"}})
	remote := c.AddPod("node-2", "remote", map[string]string{"app": "remote"})
	out := c.AddOutside()
	n1 := c.Node("node-1")
	serveSeen(t, remote.NetNS, 8080, true)
	serveUDPSeen(t, remote.NetNS, 8053)
	c.WriteManifest("remote.yaml", nodePortService("remote", "10.96.0.62", 30090, 30063, remote.IPv4, "node-2"))
	web := c.AddPod("node-1", "web", map[string]string{"app": "web"})
	serveSeen(t, web.NetNS, 8080, true)
	serveUDPSeen(t, web.NetNS, 8053)
	c.WriteManifest("web.yaml", nodePortService("web", "10.96.0.61", 30080, 30053, web.IPv4, "node-1"))
	c.WriteManifest("local.yaml", nodePortServicePolicy("local", "10.96.0.63", "Local", 30100, 30073, remote.IPv4, "node-2"))
	c.WaitService("node-1", "default", "remote")
	c.WaitService("node-1", "default", "web")
	c.WaitService("node-2", "default", "local")

	t.Run("TCP", func(t *testing.T) {
		capture := captureIPv4(t, remote.NetNS)
		to := netip.AddrPortFrom(n1.IPv4, 30090)
		var cn *conn
		polltest.Until(t, fmt.Sprintf("outside -> node-1 %s (backend on node-2, dsr): the greeting \"seen %s\", the client's own address", to, out.IPv4), 10*time.Second, 100*time.Millisecond, func() (bool, string) {
			got, err := dialFrom(out.NetNS, to)
			if err != nil {
				return false, "dial: " + err.Error()
			}
			l, err := got.line()
			if err != nil || l != "seen "+out.IPv4.String() {
				got.Close()
				return false, fmt.Sprintf("greeting %q (%v)", l, err)
			}
			cn = got
			return true, ""
		})
		defer cn.Close()
		for _, msg := range []string{"hello", strings.Repeat("0123456789", 800)} {
			if _, err := fmt.Fprintln(cn, msg); err != nil {
				t.Fatal(err)
			}
			if l, err := cn.line(); err != nil || l != msg {
				t.Fatalf("echo of %d bytes: %d bytes back (%v), want them all", len(msg), len(l), err)
			}
		}
		want := append([]byte{0x9e, 8, 0, 0}, n1.IPv4.AsSlice()...)
		binary.BigEndian.PutUint16(want[2:], 30090)
		if !capture(out.IPv4, want) {
			t.Errorf("no packet from %s in the backend pod's namespace carried the DSR option %x", out.IPv4, want)
		}
	})
	t.Run("UDP", func(t *testing.T) {
		to := netip.AddrPortFrom(n1.IPv4, 30063)
		if got := udpSeenAs(out.NetNS, to); got != out.IPv4.String() {
			t.Fatalf("outside -> node-1 %s/udp (backend on node-2, dsr): answer %q, want %s, the client's own address", to, got, out.IPv4)
		}
	})
	for _, x := range []struct {
		name     string
		node     netip.Addr
		tcp, udp uint16
	}{
		{"local backend", n1.IPv4, 30080, 30053},
		{"externalTrafficPolicy Local", c.Node("node-2").IPv4, 30100, 30073},
	} {
		t.Run(x.name, func(t *testing.T) {
			waitSeenAs(t, "outside (dsr)", devcluster.Pod{NetNS: out.NetNS}, netip.AddrPortFrom(x.node, x.tcp), out.IPv4)
			to := netip.AddrPortFrom(x.node, x.udp)
			if got := udpSeenAs(out.NetNS, to); got != out.IPv4.String() {
				t.Errorf("outside -> %s/udp (dsr): answer %q, want the client's %s", to, got, out.IPv4)
			}
		})
	}
}

// captureIPv4 opens a packet socket in the namespace at nsPath and returns
// a function that reads what it captured until a packet from src whose
// IPv4 options are opts, and says whether there was one.
func captureIPv4(t *testing.T, nsPath string) func(src netip.Addr, opts []byte) bool {
	t.Helper()
	var fd int
	err := nettest.Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_IP)))
		return err
	})
	if err != nil {
		t.Fatalf("packet socket in %s: %v", nsPath, err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.Timeval{Usec: 200_000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return func(src netip.Addr, opts []byte) bool {
		buf := make([]byte, 65536)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				// EAGAIN: read all there was.
				return false
			}
			ip := buf[:n]
			ihl := int(ip[0]&0x0f) * 4
			if n < 20 || ihl < 20 || n < ihl || netip.AddrFrom4([4]byte(ip[12:16])) != src {
				continue
			}
			if string(ip[20:ihl]) == string(opts) {
				return true
			}
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// BenchmarkNodePortDSR is BenchmarkNodePort with --lb-mode=dsr: node-2
// answers the outside client directly. Prints `nodeport-bench mode=dsr
// rps=... p99_us=... direct_rps=... direct_p99_us=... ratio=...`.
func BenchmarkNodePortDSR(b *testing.B) { benchNodePort(b, "dsr") }
