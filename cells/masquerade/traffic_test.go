package masquerade_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/cellium/cellium/cells/masquerade"
	"github.com/cellium/cellium/pkg/nettest"
)

// topology is a pod, its node and the outside world, each a namespace of
// the test's own: pod eth0 (in a test range, blackholed on the host) to
// node pod0, node eth0 (192.0.2.1) to outside ext0 (192.0.2.2). The
// outside has no route to the pods: only a masqueraded connection is
// answered.
type topology struct {
	pod, node, outside ns.NetNS
	podIP, nodeIP      netip.Addr
	outsideIP          netip.Addr
	podCIDR            netip.Prefix
}

func newTopology(t testing.TB) *topology {
	t.Helper()
	v4, _ := nettest.Ranges(t)
	tp := &topology{pod: nettest.NewNS(t), node: nettest.NewNS(t), outside: nettest.NewNS(t),
		podCIDR: v4, podIP: v4.Addr().Next().Next(), nodeIP: netip.MustParseAddr("192.0.2.1"),
		outsideIP: netip.MustParseAddr("192.0.2.2")}
	gw := v4.Addr().Next()
	veth := func(in ns.NetNS, name string, peerNS ns.NetNS, peer string) {
		t.Helper()
		err := nettest.Do(in.Path(), func() error {
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
				return err
			}
			l, err := netlink.LinkByName(peer)
			if err != nil {
				return err
			}
			return netlink.LinkSetNsFd(l, int(peerNS.Fd()))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	veth(tp.node, "pod0", tp.pod, "eth0")
	veth(tp.node, "eth0", tp.outside, "ext0")
	setup := func(in ns.NetNS, addrs map[string]netip.Prefix, defGW netip.Addr, forward bool) {
		t.Helper()
		err := nettest.Do(in.Path(), func() error {
			for dev, a := range addrs {
				l, err := netlink.LinkByName(dev)
				if err != nil {
					return err
				}
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), 32)}}); err != nil {
					return err
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			if defGW.IsValid() {
				if err := netlink.RouteAdd(&netlink.Route{Gw: defGW.AsSlice()}); err != nil {
					return err
				}
			}
			if forward {
				return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	setup(tp.pod, map[string]netip.Prefix{"eth0": netip.PrefixFrom(tp.podIP, v4.Bits())}, gw, false)
	setup(tp.node, map[string]netip.Prefix{"pod0": netip.PrefixFrom(gw, v4.Bits()), "eth0": netip.MustParsePrefix("192.0.2.1/24")}, netip.Addr{}, true)
	setup(tp.outside, map[string]netip.Prefix{"ext0": netip.MustParsePrefix("192.0.2.2/24")}, netip.Addr{}, false)
	return tp
}

// rules are the agent's rules for the topology: the pod CIDR masqueraded
// except to itself and the node.
func (tp *topology) rules() masquerade.Ruleset {
	return masquerade.Ruleset{Enabled: true, V4: masquerade.Want{
		Source:   []netip.Prefix{tp.podCIDR},
		Excluded: []netip.Prefix{tp.podCIDR, netip.PrefixFrom(tp.nodeIP, 32)},
	}}
}

// serve listens in a namespace on addr; each connection is answered with
// the address it came from, then closed (the server closes first, so
// TIME_WAIT is the server's).
func serve(t testing.TB, in ns.NetNS, addr netip.AddrPort) {
	t.Helper()
	nettest.Serve(t, in.Path(), addr.String(), func(c net.Conn) {
		fmt.Fprint(c, c.RemoteAddr().(*net.TCPAddr).IP.String())
	})
}

// seenAs connects from the pod to addr and returns the source address the
// server saw.
func (tp *topology) seenAs(addr netip.AddrPort) (string, error) {
	return tp.seenAsWithin(addr, 2*time.Second)
}

func (tp *topology) seenAsWithin(addr netip.AddrPort, timeout time.Duration) (string, error) {
	var got []byte
	err := nettest.Do(tp.pod.Path(), func() error {
		c, err := net.DialTimeout("tcp", addr.String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		got, err = io.ReadAll(c)
		return err
	})
	return string(got), err
}

// TestMasqueradeTraffic: with the agent's rules in the node's namespace,
// the pod reaches the outside as the node, and the node as itself; a
// masqueraded connection outlives its sets emptied and the table made
// again.
func TestMasqueradeTraffic(t *testing.T) {
	tp := newTopology(t)
	out := netip.AddrPortFrom(tp.outsideIP, 8080)
	node := netip.AddrPortFrom(tp.nodeIP, 8081)
	serve(t, tp.outside, out)
	serve(t, tp.node, node)

	if got, err := tp.seenAsWithin(out, 300*time.Millisecond); err == nil {
		t.Fatalf("pod -> outside without the rules: seen as %q; want no answer (the outside has no route to the pods)", got)
	}
	if _, err := masquerade.NewKernel(int(tp.node.Fd())).Sync(tp.rules()); err != nil {
		t.Fatal(err)
	}
	if got, err := tp.seenAs(out); err != nil || got != tp.nodeIP.String() {
		t.Errorf("pod -> outside: seen as %q (%v), want the node's %s", got, err, tp.nodeIP)
	}
	if got, err := tp.seenAs(node); err != nil || got != tp.podIP.String() {
		t.Errorf("pod -> node: seen as %q (%v), want the pod's %s", got, err, tp.podIP)
	}

	// The table stays, sets emptied, when the node has no pod CIDR: a
	// connection masqueraded before still carries data (without the
	// table, its nat hooks gone, it would not: the translation stops).
	echo := netip.AddrPortFrom(tp.outsideIP, 8082)
	serveEcho(t, tp.outside, echo)
	var c net.Conn
	err := nettest.Do(tp.pod.Path(), func() error {
		var err error
		c, err = net.DialTimeout("tcp", echo.String(), 2*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := masquerade.NewKernel(int(tp.node.Fd())).Sync(masquerade.Ruleset{Enabled: true}); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c, "after")
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if l, err := r.ReadString('\n'); err != nil || l != "after\n" {
		t.Errorf("established connection after the sets emptied: %q (%v), want the echo", l, err)
	}

	// A table of another shape is made again in one transaction: the
	// connection still carries data.
	nc, err := nftables.New(nftables.WithNetNSFd(int(tp.node.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	nc.AddChain(&nftables.Chain{Name: "stray", Table: &nftables.Table{Name: masquerade.TableName, Family: nftables.TableFamilyINet}})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if changed, err := masquerade.NewKernel(int(tp.node.Fd())).Sync(tp.rules()); err != nil || len(changed) != 1 || !strings.HasPrefix(changed[0], "recreated") {
		t.Fatalf("sync with a stray chain: %v %v, want the table made again", changed, err)
	}
	fmt.Fprintln(c, "rebuilt")
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if l, err := r.ReadString('\n'); err != nil || l != "rebuilt\n" {
		t.Errorf("established connection after the table was made again: %q (%v), want the echo", l, err)
	}
}

// serveEcho listens in a namespace on addr and sends every line back.
func serveEcho(t testing.TB, in ns.NetNS, addr netip.AddrPort) {
	t.Helper()
	nettest.Serve(t, in.Path(), addr.String(), nettest.Echo)
}

// conns opens and closes connections from the pod to addr, one after
// another, for d, and returns how many it made and how long it took.
func (tp *topology) conns(b *testing.B, addr netip.AddrPort, d time.Duration) (int, time.Duration) {
	var n int
	var took time.Duration
	err := nettest.Do(tp.pod.Path(), func() error {
		buf := make([]byte, 64)
		start := time.Now()
		for time.Since(start) < d {
			c, err := net.Dial("tcp", addr.String())
			if err != nil {
				return err
			}
			// Read to the server's close: the connection is complete.
			for {
				if _, err := c.Read(buf); err != nil {
					break
				}
			}
			c.Close()
			n++
		}
		took = time.Since(start)
		return nil
	})
	if err != nil {
		b.Fatalf("after %d connections to %s: %v", n, addr, err)
	}
	return n, took
}

// BenchmarkMasqueradeConnections: new TCP connections per second from a
// pod to a server outside the cluster through the agent's masquerade
// rules; beside it the same with random-fully source ports (which the
// agent does not use), with the rules in place but the server's address
// excluded (conntrack and the nat hooks, no translation), and with no
// table at all (no conntrack in the node; the outside routes the pod
// range back to the node). The four take turns, a second each, three
// rounds, each with a server port of its own (so that one's TIME_WAIT
// sockets are not another's). Prints `masq-bench conns_per_s=...
// random_fully_conns_per_s=... excluded_conns_per_s=...
// nomasq_conns_per_s=... ratio=...` (ratio: masqueraded over no table).
func BenchmarkMasqueradeConnections(b *testing.B) {
	const (
		turn   = time.Second
		rounds = 3
	)
	tp := newTopology(b)
	k := masquerade.NewKernel(int(tp.node.Fd()))
	excluded := tp.rules()
	excluded.V4.Excluded = append(excluded.V4.Excluded, netip.PrefixFrom(tp.outsideIP, 32))
	type config struct {
		name  string
		port  uint16
		rules masquerade.Ruleset
		// fullyRandom sets random-fully on the rules once written.
		fullyRandom bool
		seenAs      netip.Addr
		n           int
		took        time.Duration
	}
	configs := []*config{
		{name: "masquerade", port: 8080, rules: tp.rules(), seenAs: tp.nodeIP},
		{name: "random-fully", port: 8081, rules: tp.rules(), fullyRandom: true, seenAs: tp.nodeIP},
		{name: "excluded", port: 8082, rules: excluded, seenAs: tp.podIP},
		{name: "no table", port: 8083, rules: masquerade.Ruleset{}, seenAs: tp.podIP},
	}
	err := nettest.Do(tp.outside.Path(), func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: tp.podCIDR.Addr().AsSlice(), Mask: net.CIDRMask(tp.podCIDR.Bits(), 32)}, Gw: tp.nodeIP.AsSlice()})
	})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range configs {
		serve(b, tp.outside, netip.AddrPortFrom(tp.outsideIP, c.port))
	}
	b.ResetTimer()
	for range rounds {
		for _, c := range configs {
			b.StopTimer()
			// From no table: the rules' flags are not in their tags, so
			// random-fully rules would be kept.
			if _, err := k.Sync(masquerade.Ruleset{}); err != nil {
				b.Fatal(err)
			}
			if _, err := k.Sync(c.rules); err != nil {
				b.Fatal(err)
			}
			if c.fullyRandom {
				setFullyRandom(b, int(tp.node.Fd()))
			}
			to := netip.AddrPortFrom(tp.outsideIP, c.port)
			if got, err := tp.seenAs(to); err != nil || got != c.seenAs.String() {
				b.Fatalf("%s: pod -> outside seen as %q (%v), want %s", c.name, got, err, c.seenAs)
			}
			b.StartTimer()
			n, took := tp.conns(b, to, turn)
			c.n += n
			c.took += took
		}
	}
	b.StopTimer()
	rate := func(c *config) float64 { return float64(c.n) / c.took.Seconds() }
	fmt.Printf("masq-bench conns_per_s=%.0f random_fully_conns_per_s=%.0f excluded_conns_per_s=%.0f nomasq_conns_per_s=%.0f ratio=%.2f\n",
		rate(configs[0]), rate(configs[1]), rate(configs[2]), rate(configs[3]), rate(configs[0])/rate(configs[3]))
}

// setFullyRandom sets random-fully on the masquerade rules of the agent's
// table in the namespace of netnsFD, and checks the kernel holds them so:
// the comparison the benchmark makes, which the agent itself never writes.
func setFullyRandom(t testing.TB, netnsFD int) {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(netnsFD))
	if err != nil {
		t.Fatal(err)
	}
	rules := masqRules(t, c)
	if len(rules) == 0 {
		t.Fatal("no masquerade rule to make random-fully")
	}
	for r, m := range rules {
		m.FullyRandom = true
		c.ReplaceRule(r)
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, m := range masqRules(t, c) {
		if !m.FullyRandom {
			t.Fatal("a masquerade rule is not random-fully once replaced")
		}
	}
}

// masqRules are the rules of the agent's table that masquerade, with
// their masquerade expression.
func masqRules(t testing.TB, c *nftables.Conn) map[*nftables.Rule]*expr.Masq {
	t.Helper()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	out := map[*nftables.Rule]*expr.Masq{}
	for _, ch := range chains {
		if ch.Table.Name != masquerade.TableName {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if m, ok := e.(*expr.Masq); ok {
					out[r] = m
				}
			}
		}
	}
	return out
}

// serveAddrPort listens in a namespace on addr; each connection is told
// the address and port it came from, then every line is sent back.
func serveAddrPort(t testing.TB, in ns.NetNS, addr netip.AddrPort) {
	t.Helper()
	nettest.Serve(t, in.Path(), addr.String(), func(c net.Conn) {
		fmt.Fprintln(c, c.RemoteAddr().String())
		nettest.Echo(c)
	})
}

// lineConn is a connection to a serveAddrPort server.
type lineConn struct {
	net.Conn
	r *bufio.Reader
}

// dialFromPort connects from the namespace, bound to local, and returns
// the connection and the address the server saw.
func dialFromPort(t *testing.T, in ns.NetNS, local, to netip.AddrPort) (*lineConn, string) {
	t.Helper()
	var c net.Conn
	err := nettest.Do(in.Path(), func() error {
		var err error
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(local)}
		c, err = d.Dial("tcp", to.String())
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", to, local, err)
	}
	t.Cleanup(func() { c.Close() })
	lc := &lineConn{Conn: c, r: bufio.NewReader(c)}
	return lc, lc.line(t)
}

func (c *lineConn) line(t *testing.T) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	l, err := c.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v", c.RemoteAddr(), err)
	}
	return strings.TrimSpace(l)
}

func (c *lineConn) echoes(t *testing.T, what string) {
	t.Helper()
	fmt.Fprintln(c, what)
	if l := c.line(t); l != what {
		t.Errorf("echo of %q on %s: %q", what, c.LocalAddr(), l)
	}
}

// TestMasqueradePortClash: a pod and a host socket of the node that would
// leave with the same address and port to the same server get different
// ports, whichever comes first, and both connections carry data.
func TestMasqueradePortClash(t *testing.T) {
	tp := newTopology(t)
	if _, err := masquerade.NewKernel(int(tp.node.Fd())).Sync(tp.rules()); err != nil {
		t.Fatal(err)
	}
	to := netip.AddrPortFrom(tp.outsideIP, 8083)
	serveAddrPort(t, tp.outside, to)

	// The host first: the pod's connection from the same port is given
	// another one.
	host, seen := dialFromPort(t, tp.node, netip.AddrPortFrom(tp.nodeIP, 40000), to)
	if seen != "192.0.2.1:40000" {
		t.Fatalf("host socket seen as %s, want 192.0.2.1:40000", seen)
	}
	pod, seen := dialFromPort(t, tp.pod, netip.AddrPortFrom(tp.podIP, 40000), to)
	if ap := netip.MustParseAddrPort(seen); ap.Addr() != tp.nodeIP || ap.Port() == 40000 {
		t.Errorf("pod from port 40000 while the host uses it: seen as %s, want the node's address on another port", seen)
	}
	host.echoes(t, "host")
	pod.echoes(t, "pod")

	// The pod first: the host's connection from the port the pod's was
	// masqueraded to is given another one.
	pod2, seen := dialFromPort(t, tp.pod, netip.AddrPortFrom(tp.podIP, 40001), to)
	if seen != "192.0.2.1:40001" {
		t.Fatalf("pod from port 40001 seen as %s, want 192.0.2.1:40001 (the port kept when free)", seen)
	}
	host2, seen := dialFromPort(t, tp.node, netip.AddrPortFrom(tp.nodeIP, 40001), to)
	if ap := netip.MustParseAddrPort(seen); ap.Addr() != tp.nodeIP || ap.Port() == 40001 {
		t.Errorf("host socket from port 40001 while a pod's connection leaves from it: seen as %s, want another port", seen)
	}
	pod2.echoes(t, "pod2")
	host2.echoes(t, "host2")
}
