package devcluster_test

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/masquerade/masqtest"
	"github.com/cellium/cellium/pkg/devcluster"
	"github.com/cellium/cellium/pkg/devcluster/devclustertest"
	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// serveSeen listens on port (both families) in the namespace at nsPath,
// from this process. Each connection is first told "seen <address>", the
// client's address as the server sees it; then, with echo, every line it
// sends is sent back, else it is closed (the server closes first).
func serveSeen(t testing.TB, nsPath string, port uint16, echo bool) {
	t.Helper()
	nettest.Serve(t, nsPath, fmt.Sprintf("[::]:%d", port), func(c net.Conn) {
		remote := netip.MustParseAddrPort(c.RemoteAddr().String())
		fmt.Fprintf(c, "seen %s\n", remote.Addr().Unmap())
		if echo {
			nettest.Echo(c)
		}
	})
}

// conn is a connection made from a pod's namespace by this process.
type conn struct {
	net.Conn
	r *bufio.Reader
}

func dialFrom(nsPath string, to netip.AddrPort) (*conn, error) {
	var c net.Conn
	err := nettest.Do(nsPath, func() error {
		var err error
		c, err = net.DialTimeout("tcp", to.String(), 5*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, r: bufio.NewReader(c)}, nil
}

func (c *conn) line() (string, error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	s, err := c.r.ReadString('\n')
	return strings.TrimSpace(s), err
}

// holdConn dials a server that first writes "seen <address>" and then
// echoes lines, from the namespace nsPath, checks the address it saw, and
// returns a function that checks the connection still echoes, naming when
// in its failure. The connection is closed at the end of the test.
func holdConn(t *testing.T, nsPath string, to netip.AddrPort, seen netip.Addr) func(when string) {
	t.Helper()
	c, err := dialFrom(nsPath, to)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if l, err := c.line(); err != nil || l != "seen "+seen.String() {
		t.Fatalf("held connection to %s: server saw %q (%v), want %s", to, l, err, seen)
	}
	return func(when string) {
		t.Helper()
		fmt.Fprintln(c, when)
		if l, err := c.line(); err != nil || l != when {
			t.Fatalf("held connection to %s, %s: echo %q (%v), want %q", to, when, l, err, when)
		}
	}
}

// seenAs dials from the pod and returns the address the server saw.
func seenAs(t *testing.T, pod devcluster.Pod, to netip.AddrPort) string {
	t.Helper()
	c, err := dialFrom(pod.NetNS, to)
	if err != nil {
		return "dial: " + err.Error()
	}
	defer c.Close()
	l, err := c.line()
	if err != nil {
		return "read: " + err.Error()
	}
	return strings.TrimPrefix(l, "seen ")
}

// waitSeenAs dials from the pod to `to` every 100ms until the server says
// it saw want, and fails the test after 10s with the last answer: a
// path's first packets may meet neighbour resolution, an agent may have
// its frontend late. what names the path in the failure.
func waitSeenAs(t *testing.T, what string, pod devcluster.Pod, to netip.AddrPort, want netip.Addr) {
	t.Helper()
	polltest.Until(t, fmt.Sprintf("%s, to %s: seen as %s", what, to, want), 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		got := seenAs(t, pod, to)
		return got == want.String(), "seen as " + got
	})
}

// masqCluster is a two-node dev-cluster with an outside namespace, a client
// pod on node-1 and a server pod on node-2, for the masquerade tests of
// each routing mode.
type masqCluster struct {
	c              *devclustertest.Cluster
	client, server devcluster.Pod
	out            devcluster.Outside
	n1, n2         devcluster.Node
}

// newMasqCluster starts the cluster in routing mode with its servers: the
// server pod's on 8080, the outside's on 9000 (echo), both nodes' on 9100.
func newMasqCluster(t *testing.T, mode string) *masqCluster {
	c := devclustertest.Start(t, devcluster.Options{Nodes: 2, RoutingMode: mode})
	m := &masqCluster{c: c, client: c.AddPod("node-1", "client", nil), server: c.AddPod("node-2", "server", nil)}
	c.ServeTCP("server", 8080)
	m.out = c.AddOutside()
	m.n1, m.n2 = c.Node("node-1"), c.Node("node-2")
	serveSeen(t, m.out.NetNS, 9000, true)
	serveSeen(t, m.n2.NetNS, 9100, false)
	serveSeen(t, m.n1.NetNS, 9100, false)
	return m
}

// checkSources: the client pod reaches the outside with its node's address
// (both families), and the other node's pod and both nodes with its own.
func (m *masqCluster) checkSources(t *testing.T) {
	c, client, server, out, n1, n2 := m.c, m.client, m.server, m.out, m.n1, m.n2
	t.Run("pod to outside leaves as the node", func(t *testing.T) {
		for _, x := range []struct{ dst, want netip.Addr }{{out.IPv4, n1.IPv4}, {out.IPv6, n1.IPv6}} {
			if got := seenAs(t, client, netip.AddrPortFrom(x.dst, 9000)); got != x.want.String() {
				t.Errorf("client (node-1) -> outside %s: seen as %s, want node-1's %s", x.dst, got, x.want)
			}
		}
	})

	t.Run("pod to pod keeps the pod's address", func(t *testing.T) {
		for _, dst := range []netip.Addr{server.IPv4, server.IPv6} {
			r := c.DialTCP("client", netip.AddrPortFrom(dst, 8080))
			if r.Error != "" || r.Reply.Remote.Addr() != r.Local.Addr() || (r.Local.Addr() != client.IPv4 && r.Local.Addr() != client.IPv6) {
				t.Errorf("client (node-1) -> server %s (node-2): %+v, want the server seeing the client's own address", dst, r)
			}
		}
	})

	t.Run("pod to node keeps the pod's address", func(t *testing.T) {
		for _, x := range []struct {
			node string
			dst  netip.Addr
			want netip.Addr
		}{{"node-2", n2.IPv4, client.IPv4}, {"node-2", n2.IPv6, client.IPv6}, {"node-1", n1.IPv4, client.IPv4}} {
			start := time.Now()
			got := seenAs(t, client, netip.AddrPortFrom(x.dst, 9100))
			t.Logf("client -> %s %s: seen as %s in %s", x.node, x.dst, got, time.Since(start).Round(time.Millisecond))
			if got != x.want.String() {
				t.Errorf("client (node-1) -> %s %s: seen as %s, want the pod's %s", x.node, x.dst, got, x.want)
			}
		}
	})
}

// TestMasquerade: on a two-node dev-cluster (tunnel routing) with an
// outside namespace on its bridge, a pod reaches the outside with its
// node's address (both families), and other pods and nodes with its own; a
// masqueraded connection carries data across a restart of the node's agent;
// the kernel's NAT entries of 10,000 short connections are collected.
// TestMasqueradeNative checks the addresses in native routing.
func TestMasquerade(t *testing.T) {
	m := newMasqCluster(t, "tunnel")
	c, client, out, n1 := m.c, m.client, m.out, m.n1
	serveSeen(t, out.NetNS, 9001, false)
	serveSeen(t, out.NetNS, 9002, false) // the 10,000 connections only
	m.checkSources(t)

	t.Run("an established connection outlives a restart", func(t *testing.T) {
		echo := holdConn(t, client.NetNS, netip.AddrPortFrom(out.IPv4, 9000), n1.IPv4)
		echo("before")
		ns, err := netns.GetFromPath(n1.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		changes := masqtest.WatchNFT(t, int(ns))
		c.StopAgent("node-1")
		echo("agent-stopped")
		if got := seenAs(t, client, netip.AddrPortFrom(out.IPv4, 9001)); got != n1.IPv4.String() {
			t.Errorf("a new connection while node-1's agent is stopped: seen as %s, want node-1's %s", got, n1.IPv4)
		}
		c.StartAgent("node-1")
		echo("agent-restarted")
		if got := changes(); len(got) > 0 {
			t.Errorf("nftables changes in node-1 while its agent stopped and started: %v", got)
		}
	})

	t.Run("NAT entries are collected", func(t *testing.T) {
		// TIME_WAIT entries in node-1's conntrack last 1s instead of 120s.
		err := nettest.Do(n1.NetNS, func() error {
			return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait", []byte("1"), 0o644)
		})
		if err != nil {
			t.Fatal(err)
		}
		const n = 10000
		to := netip.AddrPortFrom(out.IPv4, 9002)
		if left := natEntries(t, n1.NetNS, client.IPv4, to, n1.IPv4); len(left) > 0 {
			t.Fatalf("NAT entries to %s before the connections: %v", to, left)
		}
		start := time.Now()
		err = nettest.Do(client.NetNS, func() error {
			for i := range n {
				if err := shortConnection(to, n1.IPv4); err != nil {
					return fmt.Errorf("connection %d: %w", i, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		peak := len(natEntries(t, n1.NetNS, client.IPv4, to, n1.IPv4))
		t.Logf("%d connections in %s; %d NAT entries right after", n, took.Round(time.Millisecond), peak)
		if peak == 0 {
			t.Fatalf("no NAT entry of the %d connections in node-1's conntrack: is the count wrong?", n)
		}
		polltest.Until(t, fmt.Sprintf("the NAT entries of %d closed connections gone from node-1's conntrack (TIME_WAIT lasts 1s)", n), 30*time.Second, 200*time.Millisecond, func() (bool, string) {
			left := natEntries(t, n1.NetNS, client.IPv4, to, n1.IPv4)
			return len(left) == 0, fmt.Sprintf("%d left: %v", len(left), left)
		})
	})
}

// natEntries are the conntrack entries in the namespace of TCP from pod
// to `to` translated to the node's address.
func natEntries(t *testing.T, nsPath string, pod netip.Addr, to netip.AddrPort, node netip.Addr) []string {
	t.Helper()
	h := nlHandle(t, nsPath)
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range flows {
		src, _ := netip.AddrFromSlice(f.Forward.SrcIP.To4())
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP.To4())
		back, _ := netip.AddrFromSlice(f.Reverse.DstIP.To4())
		if f.Forward.Protocol == 6 && src == pod && dst == to.Addr() && f.Forward.DstPort == to.Port() && back == node {
			state := -1
			if tcp, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP); ok {
				state = int(tcp.State)
			}
			out = append(out, fmt.Sprintf("sport %d->%d tcp state %d timeout %ds", f.Forward.SrcPort, f.Reverse.DstPort, state, f.TimeOut))
		}
	}
	return out
}
