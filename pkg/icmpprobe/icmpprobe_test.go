package icmpprobe_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/icmpprobe"
	"github.com/cellium/cellium/pkg/nettest"
)

// Many concurrent pings over the two shared sockets each get their own
// reply; an address nobody answers for times out.
func TestPing(t *testing.T) {
	p := newPinger(t)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 50 {
		dst := netip.MustParseAddr("127.0.0.1")
		if i%2 == 1 {
			dst = netip.MustParseAddr("::1")
		}
		wg.Go(func() {
			if rtt, err := p.Ping(ctx, dst); err != nil || rtt <= 0 {
				t.Errorf("ping %s = %v, %v", dst, rtt, err)
			}
		})
	}
	wg.Wait()
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	// 192.0.2.0/24 is unrouted in the test's namespace: no reply.
	if _, err := p.Ping(short, netip.MustParseAddr("192.0.2.1")); err == nil {
		t.Fatal("a ping to an address nobody answers for succeeded")
	}
}

// TestCloseEndsBlockedReads: Close returns without waiting for the readers'
// periodic wakeup (set to an hour here), which a node agent's stop would
// otherwise wait for.
func TestCloseEndsBlockedReads(t *testing.T) {
	defer icmpprobe.SetReadWakeup(time.Hour)()
	p := newPinger(t)
	// A reply on each socket: its reader has run and is back in a
	// blocking read.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, dst := range []string{"127.0.0.1", "::1"} {
		if _, err := p.Ping(ctx, netip.MustParseAddr(dst)); err != nil {
			t.Fatalf("ping %s: %v", dst, err)
		}
	}
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting for the readers after 10s: a blocked read was not woken")
	}
}

// newPinger opens a Pinger in a new network namespace whose loopback is up.
func newPinger(t *testing.T) *icmpprobe.Pinger {
	t.Helper()
	nettest.RequireRoot(t)
	ns := nettest.NewNS(t)
	var p *icmpprobe.Pinger
	err := nettest.Do(ns.Path(), func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		p, err = icmpprobe.New()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReplyFilter: a socket with the filter reads the echo reply with its
// identifier and nothing else: not the echo requests (which loopback shows
// raw sockets too), not another identifier's replies.
func TestReplyFilter(t *testing.T) {
	nettest.RequireRoot(t)
	ns := nettest.NewNS(t)
	const ours, theirs = 0x1234, 0x4321
	for _, tc := range []struct {
		dst           netip.Addr
		domain, proto int
		sa            unix.Sockaddr
	}{
		{netip.MustParseAddr("127.0.0.1"), unix.AF_INET, unix.IPPROTO_ICMP, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}},
		{netip.MustParseAddr("::1"), unix.AF_INET6, unix.IPPROTO_ICMPV6, &unix.SockaddrInet6{Addr: netip.IPv6Loopback().As16()}},
	} {
		var filtered, sender int
		err := nettest.Do(ns.Path(), func() (err error) {
			if filtered, err = unix.Socket(tc.domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, tc.proto); err != nil {
				return err
			}
			if err := icmpprobe.AttachReplyFilter(filtered, tc.dst.Is6(), ours); err != nil {
				return err
			}
			sender, err = unix.Socket(tc.domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, tc.proto)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(filtered)
		defer unix.Close(sender)
		// Another identifier's exchange first, then ours.
		for _, id := range []uint16{theirs, ours} {
			if err := unix.Sendto(sender, icmpprobe.EchoRequest(tc.dst.Is6(), id, 7), 0, tc.sa); err != nil {
				t.Fatal(err)
			}
		}
		tv := unix.NsecToTimeval((5 * time.Second).Nanoseconds())
		if err := unix.SetsockoptTimeval(filtered, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1500)
		n, from, err := unix.Recvfrom(filtered, buf, 0)
		if err != nil {
			t.Fatalf("%s: read: %v", tc.dst, err)
		}
		src, id, _, ok := icmpprobe.ParseEchoReply(buf[:n], from)
		if !ok || id != ours || src != tc.dst {
			t.Fatalf("%s: the filtered socket's first packet: echo reply %v, id %#x from %s; want our reply", tc.dst, ok, id, src)
		}
		// Nothing else is queued: the other exchange was dropped.
		if n, _, err := unix.Recvfrom(filtered, buf, unix.MSG_DONTWAIT); err == nil {
			t.Fatalf("%s: a second packet of %d bytes passed the filter", tc.dst, n)
		}
	}
}
