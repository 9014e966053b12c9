package devcluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// pathMTU is the MTU a node forwards to a backend pod with, below the
// 1500 of everything else.
const pathMTU = 1200

// TestNodePortICMP: ICMP errors through a NodePort (issue 14), from the
// outside namespace through node-1's NodePort to a backend on node-2 and
// to one on node-1, in native routing and tunnel.
//
// Path MTU discovery: the node's link to the backend pod has a smaller MTU
// (pathMTU); that node answers a packet too big for it, sent with DF, with
// fragmentation needed, quoting the translated packet, and node-1 must
// translate that error for the client: a connected UDP socket with
// IP_PMTUDISC_DO learns the path MTU (IP_MTU), and a bulk TCP transfer,
// whose full-sized segments cannot be forwarded to the pod, completes.
// Without the translation the client never hears of the error: IP_MTU
// stays 1500 and the transfer stalls.
//
// Port unreachable from the backend (nothing listens on its port) reaches
// the client's connected socket as ECONNREFUSED: from node-2 to node-1's
// address, translated at node-1's ingress, or from the local pod,
// translated at node-1's egress.
//
// The other way: the client's port unreachable about a reply (the client
// closed its socket) reaches the backend's socket connected to the peer it
// sees (node-1's address and NAT port, or the client), which reports
// ECONNREFUSED; without the translation the error stays at node-1.
func TestNodePortICMP(t *testing.T) {
	for _, mode := range []string{"native", "tunnel"} {
		t.Run(mode, func(t *testing.T) { nodePortICMP(t, mode) })
	}
}

func nodePortICMP(t *testing.T, mode string) {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, RoutingMode: mode})
	local := c.AddPod("node-1", "local", map[string]string{"app": "local"})
	remote := c.AddPod("node-2", "remote", map[string]string{"app": "remote"})
	out := c.AddOutside()
	n1 := c.Node("node-1")
	for _, pod := range []devcluster.Pod{local, remote} {
		serveUDPSeen(t, pod.NetNS, 8053)
		nettest.Serve(t, pod.NetNS, "0.0.0.0:8080", countBytes)
	}
	c.WriteManifest("local.yaml", nodePortService("local", "10.96.0.61", 30080, 30053, local.IPv4, "node-1"))
	c.WriteManifest("remote.yaml", nodePortService("remote", "10.96.0.62", 30090, 30063, remote.IPv4, "node-2"))
	c.WriteManifest("local-refused.yaml", udpNodePortService("local-refused", "10.96.0.64", 30054, local.IPv4, "node-1"))
	c.WriteManifest("remote-refused.yaml", udpNodePortService("remote-refused", "10.96.0.65", 30064, remote.IPv4, "node-2"))
	for _, svc := range []string{"local", "remote", "local-refused", "remote-refused"} {
		c.WaitService("node-1", "default", svc)
	}

	for _, x := range []struct {
		name     string
		pod      devcluster.Pod
		node     string
		tcp, udp uint16
		refused  uint16
		seen     netip.Addr
	}{
		// node-2 sends the error to node-1's address, the packet's
		// source after SNAT: node-1's ingress translates it.
		{"remote backend", remote, "node-2", 30090, 30063, 30064, n1.IPv4},
		// node-1 itself sends the error to the client, quoting the
		// packet after DNAT: node-1's egress translates it.
		{"local backend", local, "node-1", 30080, 30053, 30054, out.IPv4},
	} {
		t.Run(x.name, func(t *testing.T) {
			udpTo := netip.AddrPortFrom(n1.IPv4, x.udp)
			if got := udpSeenAs(out.NetNS, udpTo); got != x.seen.String() {
				t.Fatalf("outside -> node-1 %s/udp (backend on %s): answer %q, want %s", udpTo, x.node, got, x.seen)
			}
			t.Run("port unreachable from the client", func(t *testing.T) {
				refusedByClient(t, out.NetNS, x.pod.NetNS, netip.AddrPortFrom(n1.IPv4, x.refused), x.seen)
			})
			// Nothing listens there now.
			t.Run("port unreachable from the backend", func(t *testing.T) {
				refusedByBackend(t, out.NetNS, netip.AddrPortFrom(n1.IPv4, x.refused))
			})
			setPodLinkMTU(t, c.Node(x.node).NetNS, x.pod.IPv4, pathMTU)
			t.Run("path MTU/UDP", func(t *testing.T) { pathMTUUDP(t, out.NetNS, udpTo, x.seen) })
			t.Run("path MTU/TCP", func(t *testing.T) { pathMTUTCP(t, out.NetNS, netip.AddrPortFrom(n1.IPv4, x.tcp)) })
		})
	}
}

// pathMTUUDP: a connected UDP socket of the namespace at nsPath with
// IP_PMTUDISC_DO learns the path MTU to to, and a datagram that fits is
// answered with "seen <seen>".
func pathMTUUDP(t *testing.T, nsPath string, to netip.AddrPort, seen netip.Addr) {
	forgetPathMTUs(t, nsPath)
	uc, err := nettest.In(nsPath, func() (*net.UDPConn, error) {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
		if err != nil {
			return nil, err
		}
		if err := sockopt(c, func(fd int) error {
			return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		}); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	big := make([]byte, 1400)
	mtu := socketMTU(t, uc)
	if mtu != 1500 {
		t.Fatalf("IP_MTU before sending: %d, want 1500 (the client's link)", mtu)
	}
	var sendErrs []string
	// Each datagram too big for the pod's link draws an error (ICMP is
	// rate limited, so more than one may be needed); the socket learns
	// the MTU when one comes back translated.
	polltest.Until(t, fmt.Sprintf("outside -> node-1 %s/udp, %d bytes with DF, backend behind an MTU of %d: the socket's IP_MTU %d", to, len(big), pathMTU, pathMTU), 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		if _, err := uc.Write(big); err != nil {
			if !errors.Is(err, syscall.EMSGSIZE) {
				t.Fatalf("send %d bytes: %v", len(big), err)
			}
			sendErrs = append(sendErrs, err.Error())
		}
		mtu = socketMTU(t, uc)
		return mtu == pathMTU, fmt.Sprintf("IP_MTU %d (send errors: %v)", mtu, sendErrs)
	})
	// Now that it knows, a datagram too big fails at once.
	if _, err := uc.Write(big); !errors.Is(err, syscall.EMSGSIZE) {
		t.Errorf("send %d bytes after learning the MTU %d: %v, want EMSGSIZE", len(big), mtu, err)
	}
	// And one that fits still gets through.
	buf := make([]byte, 100)
	var got string
	polltest.Until(t, fmt.Sprintf("an answer to a %d-byte datagram through a path MTU of %d", pathMTU-28, pathMTU), 5*time.Second, 0, func() (bool, string) {
		if _, err := uc.Write(make([]byte, pathMTU-28)); err != nil && !errors.Is(err, syscall.EMSGSIZE) {
			t.Fatal(err)
		}
		uc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := uc.Read(buf)
		if err != nil {
			return false, "read: " + err.Error()
		}
		got = string(buf[:n])
		return true, ""
	})
	if want := "seen " + seen.String(); got != want {
		t.Errorf("answer to a %d-byte datagram: %q, want %q", pathMTU-28, got, want)
	}
}

// pathMTUTCP: a bulk transfer from the namespace at nsPath to to, whose
// full-sized segments do not fit the path, completes, the connection
// having learnt the path MTU.
func pathMTUTCP(t *testing.T, nsPath string, to netip.AddrPort) {
	const size = 4 << 20
	forgetPathMTUs(t, nsPath)
	cn, err := nettest.In(nsPath, func() (net.Conn, error) { return net.DialTimeout("tcp4", to.String(), 5*time.Second) })
	if err != nil {
		t.Fatalf("outside -> node-1 %s: %v", to, err)
	}
	defer cn.Close()
	cn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := cn.Write(make([]byte, size)); err != nil {
		t.Fatalf("send %d bytes through node-1 %s to a backend behind an MTU of %d: %v", size, to, pathMTU, err)
	}
	cn.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(cn)
	if err != nil {
		t.Fatalf("the backend's count of %d bytes sent through node-1 %s: %v", size, to, err)
	}
	if n, _ := strconv.Atoi(strings.TrimSpace(string(got))); n != size {
		t.Fatalf("the backend got %q bytes, want %d", got, size)
	}
	// It went through because the connection learnt the path's MTU.
	if mtu := socketMTU(t, cn.(*net.TCPConn)); mtu != pathMTU {
		t.Errorf("the connection's IP_MTU after the transfer: %d, want %d", mtu, pathMTU)
	}
}

// refusedPort is the backend's UDP port of udpNodePortService.
const refusedPort = 8054

// refusedByClient: a client in the namespace at clientNS sends a datagram
// to to; the backend, in podNS, sees it from seen, answers it from a
// socket connected to its sender, which the client receives; the client
// closes its socket, and the backend's next datagrams draw its port
// unreachable, which must reach the backend's socket as ECONNREFUSED.
func refusedByClient(t *testing.T, clientNS, podNS string, to netip.AddrPort, seen netip.Addr) {
	reuse := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		if cerr := rc.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		}); cerr != nil {
			return cerr
		}
		return err
	}}
	bind := fmt.Sprintf("0.0.0.0:%d", refusedPort)
	ln, err := nettest.In(podNS, func() (net.PacketConn, error) {
		return reuse.ListenPacket(context.Background(), "udp4", bind)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := nettest.In(clientNS, func() (net.Conn, error) { return net.Dial("udp4", to.String()) })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	// The client's first datagram, as the backend sees it.
	buf := make([]byte, 100)
	var from net.Addr
	polltest.Until(t, fmt.Sprintf("outside -> node-1 %s/udp: a datagram at the backend", to), 5*time.Second, 0, func() (bool, string) {
		if _, err := cc.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		ln.SetReadDeadline(time.Now().Add(time.Second))
		_, a, err := ln.ReadFrom(buf)
		if err != nil {
			return false, "the backend's read: " + err.Error()
		}
		from = a
		return true, ""
	})
	if got := netip.MustParseAddrPort(from.String()).Addr(); got != seen {
		t.Fatalf("the backend sees %v, want %v", from, seen)
	}

	// The backend's socket connected to it.
	d := net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.MustParseAddrPort(bind)), Control: reuse.Control}
	bc, err := nettest.In(podNS, func() (net.Conn, error) { return d.Dial("udp4", from.String()) })
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	if _, err := bc.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	cc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := cc.Read(buf); err != nil || string(buf[:n]) != "reply" {
		t.Fatalf("the client got %q (%v) of the backend's connected socket, want %q", buf[:n], err, "reply")
	}

	cc.Close()
	polltest.Until(t, fmt.Sprintf("backend -> %v after the client closed its socket: ECONNREFUSED from the client's port unreachable", from), 10*time.Second, 0, func() (bool, string) {
		_, werr := bc.Write([]byte("again"))
		bc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, rerr := bc.Read(buf)
		return errors.Is(werr, syscall.ECONNREFUSED) || errors.Is(rerr, syscall.ECONNREFUSED), fmt.Sprintf("write %v, read %v", werr, rerr)
	})
}

// refusedByBackend: a client in the namespace at clientNS sends to to,
// whose backend has no socket on its port; the backend's port unreachable
// must reach the client's connected socket as ECONNREFUSED.
func refusedByBackend(t *testing.T, clientNS string, to netip.AddrPort) {
	cc, err := nettest.In(clientNS, func() (net.Conn, error) { return net.Dial("udp4", to.String()) })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	buf := make([]byte, 100)
	polltest.Until(t, fmt.Sprintf("outside -> node-1 %s/udp, no socket at the backend: ECONNREFUSED from the backend's port unreachable", to), 10*time.Second, 0, func() (bool, string) {
		_, werr := cc.Write([]byte("anyone?"))
		cc.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, rerr := cc.Read(buf)
		return errors.Is(werr, syscall.ECONNREFUSED) || errors.Is(rerr, syscall.ECONNREFUSED), fmt.Sprintf("write %v, read %v", werr, rerr)
	})
}

// udpNodePortService is a NodePort Service with a UDP port 54 (NodePort
// nodePort, target refusedPort), and its EndpointSlice with the one
// backend, a pod on node.
func udpNodePortService(name, clusterIP string, nodePort uint16, backend netip.Addr, node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %[1]s, namespace: default}
spec:
  type: NodePort
  clusterIP: %[2]s
  ports:
  - {name: refused, port: 54, targetPort: %[6]d, nodePort: %[3]d, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %[1]s-1, namespace: default, labels: {kubernetes.io/service-name: %[1]s}}
addressType: IPv4
ports: [{name: refused, port: %[6]d, protocol: UDP}]
endpoints:
- addresses: [%[4]s]
  nodeName: %[5]s
  conditions: {ready: true}
`, name, clusterIP, nodePort, backend, node, refusedPort)
}

// countBytes reads c to its end and answers with the number of bytes.
func countBytes(c net.Conn) {
	n, _ := io.Copy(io.Discard, c)
	fmt.Fprintln(c, n)
}

// sockopt runs fn on c's file descriptor.
func sockopt(c syscall.Conn, fn func(fd int) error) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// socketMTU is c's IP_MTU: the path MTU its kernel knows for the peer.
func socketMTU(t *testing.T, c syscall.Conn) int {
	t.Helper()
	var mtu int
	if err := sockopt(c, func(fd int) (err error) {
		mtu, err = unix.GetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU)
		return err
	}); err != nil {
		t.Fatalf("IP_MTU: %v", err)
	}
	return mtu
}

// forgetPathMTUs makes the namespace at nsPath forget the path MTUs it
// learnt (ip route flush cache), so that each test learns its own.
func forgetPathMTUs(t *testing.T, nsPath string) {
	t.Helper()
	err := nettest.Do(nsPath, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/route/flush", []byte("1"), 0)
	})
	if err != nil {
		t.Fatalf("flush the route cache of %s: %v", nsPath, err)
	}
}

// setPodLinkMTU sets the MTU of the node's link its route to pod goes
// through (the host side of the pod's veth) to mtu.
func setPodLinkMTU(t *testing.T, nodeNS string, pod netip.Addr, mtu int) {
	t.Helper()
	err := nettest.Do(nodeNS, func() error {
		routes, err := netlink.RouteGet(pod.AsSlice())
		if err != nil {
			return err
		}
		if len(routes) == 0 {
			return fmt.Errorf("no route to %s", pod)
		}
		link, err := netlink.LinkByIndex(routes[0].LinkIndex)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(link, mtu)
	})
	if err != nil {
		t.Fatalf("set the MTU of %s's link in %s to %d: %v", pod, nodeNS, mtu, err)
	}
}
