// Package nettest gives tests network namespaces of their own, host
// blackhole routes over their test ranges, and real ICMP echo from inside a
// namespace, so that test traffic never leaves the machine.
//
//	v4, v6 := nettest.Ranges(t)        // 10.244.X.0/24 and fd00:10:244:X::/64, blackholed on the host
//	pod := nettest.NewNS(t)            // removed when the test ends
//	err := nettest.Ping(pod.Path(), router, time.Second)
package nettest

import (
	"bufio"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/icmpprobe"
	"github.com/cellium/cellium/pkg/netnsrun"
)

// RequireRoot skips the test unless it runs as root: it makes namespaces,
// links and routes.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs and routes")
	}
}

// NewNS creates a network namespace, bind-mounted under /var/run/netns, and
// removes it when the test ends. Its loopback is up.
func NewNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		testutils.UnmountNS(n)
	})
	err = n.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		t.Fatalf("set lo up in %s: %v", n.Path(), err)
	}
	return n
}

// Netlink opens the namespace at path (a handle for netlink's *At
// functions and options) and a netlink handle in it; both are closed when
// the test ends.
func Netlink(t testing.TB, path string) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", path, err)
	}
	t.Cleanup(h.Close)
	return ns, h
}

// Ranges picks an IPv4 /24 in 10.244.128.0/17 and an IPv6 /64 in
// fd00:10:244::/48 that no other test uses at the moment, and adds host
// blackhole routes over both, removed when the test ends: a pod address the
// test forgot to route is then dropped, not sent out the default route.
func Ranges(t testing.TB) (v4, v6 netip.Prefix) {
	t.Helper()
	RequireRoot(t)
	for range 64 {
		n := 128 + rand.IntN(128)
		v4 = netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n))
		v6 = netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%x::/64", n))
		if err := blackhole(v4); errors.Is(err, unix.EEXIST) {
			continue
		} else if err != nil {
			t.Fatalf("blackhole route %s: %v", v4, err)
		}
		t.Cleanup(func() { netlink.RouteDel(blackholeRoute(v4)) })
		if err := blackhole(v6); err != nil {
			t.Fatalf("blackhole route %s: %v", v6, err)
		}
		t.Cleanup(func() { netlink.RouteDel(blackholeRoute(v6)) })
		return v4, v6
	}
	t.Fatal("no free test range in 10.244.128.0/17: every /24 has a blackhole route")
	return
}

func blackholeRoute(p netip.Prefix) *netlink.Route {
	return &netlink.Route{
		Dst:  &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
		Type: unix.RTN_BLACKHOLE,
	}
}

func blackhole(p netip.Prefix) error { return netlink.RouteAdd(blackholeRoute(p)) }

// Do runs fn on a thread in the network namespace at path: see
// netnsrun.Do.
func Do(path string, fn func() error) error { return netnsrun.Do(path, fn) }

// In runs fn in the network namespace at path and returns its result: see
// netnsrun.In.
func In[T any](path string, fn func() (T, error)) (T, error) { return netnsrun.In(path, fn) }

// Serve listens on TCP addr in the network namespace at path and hands
// each connection to handle in a goroutine of its own, closing it after;
// it stops when the test ends.
func Serve(t testing.TB, path, addr string, handle func(net.Conn)) {
	t.Helper()
	ln, err := In(path, func() (net.Listener, error) { return net.Listen("tcp", addr) })
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, path, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// Echo sends every line it reads back on c.
func Echo(c net.Conn) {
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		fmt.Fprintln(c, sc.Text())
	}
}

// Ping sends one ICMP echo request from the network namespace at nsPath to
// dst and waits up to timeout for the reply.
func Ping(nsPath string, dst netip.Addr, timeout time.Duration) error {
	domain, proto := unix.AF_INET, unix.IPPROTO_ICMP
	if dst.Is6() {
		domain, proto = unix.AF_INET6, unix.IPPROTO_ICMPV6
	}
	var fd int
	err := Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		return err
	})
	if err != nil {
		return fmt.Errorf("ping %s: raw socket: %w", dst, err)
	}
	defer unix.Close(fd)

	id, seq := uint16(rand.Uint32()), uint16(rand.Uint32())
	req := icmpprobe.EchoRequest(dst.Is6(), id, seq)
	var sa unix.Sockaddr
	if dst.Is4() {
		sa = &unix.SockaddrInet4{Addr: dst.As4()}
	} else {
		sa = &unix.SockaddrInet6{Addr: dst.As16()}
	}
	if err := unix.Sendto(fd, req, 0, sa); err != nil {
		return fmt.Errorf("ping %s from %s: %w", dst, nsPath, err)
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("ping %s from %s: no reply within %s", dst, nsPath, timeout)
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("ping %s from %s: %w", dst, nsPath, err)
		}
		if src, rid, rseq, ok := icmpprobe.ParseEchoReply(buf[:n], from); ok && src == dst && rid == id && rseq == seq {
			return nil
		}
	}
}
