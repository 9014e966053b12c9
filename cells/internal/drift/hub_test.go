package drift

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/nettest"
	"github.com/cellium/cellium/pkg/polltest"
)

// running is a Follower's Run in a goroutine, its batches on a channel.
type running struct {
	f         *Follower
	batches   chan Batch
	following chan struct{}
	ran       chan error
	cancel    context.CancelFunc
	stopOnce  sync.Once
	err       error
}

type followingHealth struct {
	cell.Health
	once      sync.Once
	following chan struct{}
}

func (h *followingHealth) OK(string) { h.once.Do(func() { close(h.following) }) }

// run starts f.Run with a Handle that sends each batch (unless handle is
// given, which is called first) and waits until f follows. The test's
// cleanup stops it and fails on Run's error unless ended says it was
// expected.
func run(t *testing.T, f *Follower, handle func(Batch)) *running {
	t.Helper()
	r := &running{f: f, batches: make(chan Batch, 100000), following: make(chan struct{}), ran: make(chan error, 1)}
	f.Handle = func(_ context.Context, b Batch) {
		if handle != nil {
			handle(b)
		}
		r.batches <- b
	}
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	go func() { r.ran <- f.Run(ctx, &followingHealth{following: r.following}) }()
	t.Cleanup(func() { r.stop() })
	select {
	case <-r.following:
	case err := <-r.ran:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not following after 10s")
	}
	return r
}

// stop ends Run and returns its error.
func (r *running) stop() error {
	r.stopOnce.Do(func() {
		r.cancel()
		r.err = <-r.ran
	})
	return r.err
}

// routes collects the test routes (10.99.x.y/32) each batch brings until
// it has n of them, 30 s at most; it fails on a Resync or the end of Run.
func (r *running) routes(t *testing.T, who string, n int) {
	t.Helper()
	seen := map[string]bool{}
	timeout := time.After(30 * time.Second)
	for len(seen) < n {
		select {
		case b := <-r.batches:
			if b.Resync {
				t.Fatalf("%s: a Resync after %d of the %d routes", who, len(seen), n)
			}
			for _, u := range b.Routes {
				if u.Type == unix.RTM_NEWROUTE && u.Dst != nil && u.Dst.IP.To4() != nil && u.Dst.IP.To4()[1] == 99 {
					seen[u.Dst.String()] = true
				}
			}
		case err := <-r.ran:
			r.ran <- err
			t.Fatalf("%s: Run ended after %d of the %d routes: %v", who, len(seen), n, err)
		case <-timeout:
			t.Fatalf("%s: %d of the %d routes handed over after 30s", who, len(seen), n)
		}
	}
}

// routeNS is a namespace with a veth up, and addRoutes, which adds routes
// 10.99.x.y/32 (from, to] through it.
func routeNS(t *testing.T) (path string, addRoutes func(from, to int)) {
	t.Helper()
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	_, h := nettest.Netlink(t, n.Path())
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "r0"}, PeerName: "r1"}); err != nil {
		t.Fatalf("add r0: %v", err)
	}
	var index int
	for _, name := range []string{"r0", "r1"} {
		link, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(link)
		}
		if err != nil {
			t.Fatalf("set %s up: %v", name, err)
		}
		if name == "r0" {
			index = link.Attrs().Index
		}
	}
	return n.Path(), func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			dst := &net.IPNet{IP: net.IPv4(10, 99, byte(i>>8), byte(i)), Mask: net.CIDRMask(32, 32)}
			if err := h.RouteAdd(&netlink.Route{LinkIndex: index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
				t.Fatalf("add route %d: %v", i, err)
			}
		}
	}
}

// receivers counts the goroutines of netlink's route subscriptions that
// receive (each keeps a 128 KB stack).
func receivers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "netlink.routeSubscribeAt.func2(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// noReceivers waits until no goroutine receives route updates (a
// subscription closed ends its receiver a moment after its channel).
func noReceivers(t *testing.T) {
	t.Helper()
	polltest.Until(t, "no route receiver", 10*time.Second, time.Millisecond, func() (bool, string) {
		n := receivers()
		return n == 0, fmt.Sprintf("%d route receivers", n)
	})
}

// TestFollowersShareASubscription: two Followers of a namespace's routes
// share one subscription, one goroutine receiving, and each gets every
// update of a burst.
func TestFollowersShareASubscription(t *testing.T) {
	path, addRoutes := routeNS(t)
	noReceivers(t)
	h := &Hub{}
	a := run(t, &Follower{Netns: path, Routes: true, Hub: h}, nil)
	b := run(t, &Follower{Netns: path, Routes: true, Hub: h}, nil)
	if n := h.numOpen(); n != 1 {
		t.Errorf("%d subscriptions open for two followers of the routes of one namespace, want 1", n)
	}
	if n := receivers(); n != 1 {
		t.Errorf("%d receiving goroutines for two followers of the routes of one namespace, want 1", n)
	}
	const burst = 2000
	addRoutes(0, burst)
	a.routes(t, "the first follower", burst)
	b.routes(t, "the second follower", burst)
	for _, r := range []*running{a, b} {
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	if n := h.numOpen(); n != 0 {
		t.Errorf("%d subscriptions open after both followers stopped, want 0", n)
	}
}

// TestSlowFollowerResyncs: a follower whose Handle is stuck while more
// updates come than its queue holds gets a Resync (and its listing of the
// devices again) once it is back; the other follower of the subscription
// gets every update meanwhile, without one.
func TestSlowFollowerResyncs(t *testing.T) {
	path, addRoutes := routeNS(t)
	h := &Hub{}
	busy, release := make(chan struct{}), make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	var once sync.Once
	slow := run(t, &Follower{Netns: path, Links: true, Routes: true, Hub: h, queueLimit: 64}, func(b Batch) {
		if len(b.Routes) > 0 {
			once.Do(func() {
				close(busy)
				<-release
			})
		}
	})
	other := run(t, &Follower{Netns: path, Routes: true, Hub: h}, nil)
	// The listing of the slow one's devices.
	if b := <-slow.batches; len(b.Links) == 0 || b.Resync {
		t.Fatalf("the slow follower's first batch %+v, want the listing of the devices", b)
	}
	addRoutes(0, 1)
	<-busy
	const burst = 500
	addRoutes(1, burst)
	other.routes(t, "the other follower", burst)
	close(release)
	released = true
	// The slow follower: its first route, then a Resync and the listing.
	timeout := time.After(30 * time.Second)
	var got []string
	for !slices.Contains(got, "resync") || !slices.Contains(got, "links") {
		select {
		case b := <-slow.batches:
			switch {
			case b.Resync:
				got = append(got, "resync")
			case len(b.Links) > 0:
				if slices.Contains(got, "resync") {
					got = append(got, "links")
				}
			default:
				got = append(got, fmt.Sprintf("%d routes", len(b.Routes)))
			}
		case err := <-slow.ran:
			t.Fatalf("the slow follower's Run ended: %v", err)
		case <-timeout:
			t.Fatalf("the slow follower got %v after 30s, want a Resync, then the listing of the devices", got)
		}
	}
	for _, r := range []*running{slow, other} {
		if err := r.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// TestLateFollowerConverges: a follower that joins a subscription
// already open while devices come and go (its listing and the updates
// queued for it overlap) ends with the devices the kernel has: the
// listing comes first and the updates after it, in order.
func TestLateFollowerConverges(t *testing.T) {
	nettest.RequireRoot(t)
	n := nettest.NewNS(t)
	ns, nh := nettest.Netlink(t, n.Path())
	h := &Hub{}
	early := run(t, &Follower{Netns: n.Path(), Links: true, Hub: h}, nil)
	defer early.stop()

	stopChurn, churned := make(chan struct{}), make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopChurn:
				churned <- nil
				return
			default:
			}
			name := fmt.Sprintf("c%d", i%20)
			if l, err := nh.LinkByName(name); err == nil {
				if err := nh.LinkDel(l); err != nil {
					churned <- err
					return
				}
			} else if err := nh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
				churned <- err
				return
			}
		}
	}()
	// The late follower's view: index to name, from its listing and
	// updates in order.
	view := map[int32]string{}
	var mu sync.Mutex
	late := run(t, &Follower{Netns: n.Path(), Links: true, Hub: h}, func(b Batch) {
		mu.Lock()
		defer mu.Unlock()
		for _, u := range b.Links {
			if u.Header.Type == unix.RTM_DELLINK {
				delete(view, u.Index)
			} else {
				view[u.Index] = u.Attrs().Name
			}
		}
	})
	defer late.stop()
	if n := h.numOpen(); n != 1 {
		t.Errorf("%d subscriptions open for two followers of the links of one namespace, want 1", n)
	}
	// Churn on while the late one lists and catches up.
	for range 3 {
		select {
		case <-late.batches:
		case <-time.After(10 * time.Second):
			t.Fatal("the late follower got no batch in 10s")
		}
	}
	close(stopChurn)
	if err := <-churned; err != nil {
		t.Fatalf("churn: %v", err)
	}
	AddMarker(t, ns)
	deadline := time.After(10 * time.Second)
	for marked := false; !marked; {
		select {
		case b := <-late.batches:
			for _, u := range b.Links {
				marked = marked || u.Attrs().Name == "marker0"
			}
		case <-deadline:
			t.Fatal("the late follower did not see marker0 after 10s")
		}
	}
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	want := map[int32]string{}
	for _, l := range links {
		want[int32(l.Attrs().Index)] = l.Attrs().Name
	}
	// marker1 may come after marker0.
	polltest.Until(t, "the late follower's devices the kernel's", 10*time.Second, time.Millisecond, func() (bool, string) {
		for {
			select {
			case <-late.batches:
				continue
			default:
			}
			break
		}
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(view) == fmt.Sprint(want), fmt.Sprintf("follower %v, kernel %v", view, want)
	})
}

// TestOverflowEndsEveryFollower: when the kernel drops updates because
// the subscription's socket buffer is full (ENOBUFS), every follower of
// the subscription ends with that error, and each one's next Run starts
// with a Resync.
func TestOverflowEndsEveryFollower(t *testing.T) {
	path, addRoutes := routeNS(t)
	h := &Hub{socketBuffer: 4096}
	a := run(t, &Follower{Netns: path, Routes: true, Hub: h}, nil)
	b := run(t, &Follower{Netns: path, Routes: true, Hub: h}, nil)
	h.mu.Lock()
	var sh *shared
	for _, s := range h.subs {
		sh = s
	}
	h.mu.Unlock()
	// The hub held back by a subscriber (its queue locked): netlink's
	// goroutine blocks on its channel, the socket fills.
	held := sh.subscribers()[0]
	held.mu.Lock()
	addRoutes(0, 2000)
	held.mu.Unlock()
	for _, r := range []*running{a, b} {
		select {
		case err := <-r.ran:
			r.ran <- err // for stop
			if err == nil || !strings.Contains(err.Error(), "no buffer space") {
				t.Errorf("Run ended with %v, want the kernel's ENOBUFS", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run still on 30s after the overflow")
		}
	}
	// The job's retry: a new subscription, a Resync first.
	for _, r := range []*running{a, b} {
		r.stop()
		r.f.Handle = nil
		again := run(t, r.f, nil)
		select {
		case b := <-again.batches:
			if !b.Resync {
				t.Errorf("the first batch after the overflow %+v, want a Resync", b)
			}
		case <-time.After(10 * time.Second):
			t.Error("no batch after the overflow")
		}
		if err := again.stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
}

// TestCloseEndsTheReceiver: the last subscriber's Close ends the
// subscription while netlink's goroutine has more updates than its
// channel holds and nobody takes them: the hub reads them to the end,
// netlink's receiving goroutine closes its channel and ends (were it left
// blocked sending, it would be so for good), and Close returns once the
// hub's goroutine has seen it.
func TestCloseEndsTheReceiver(t *testing.T) {
	path, addRoutes := routeNS(t)
	h := &Hub{}
	s, err := h.Subscribe(path, Kinds{Routes: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	var sh *shared
	for _, x := range h.subs {
		sh = x
	}
	h.mu.Unlock()
	// The hub held back by the subscriber (its queue locked) while the
	// updates come: netlink's goroutine blocked sending, its channel
	// (64) full.
	s.mu.Lock()
	addRoutes(0, 500)
	polltest.Until(t, "netlink's channel full", 10*time.Second, time.Millisecond, func() (bool, string) {
		return sh.pending() == updateBuffer, fmt.Sprintf("%d of %d", sh.pending(), updateBuffer)
	})
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	// Once Close has ended netlink's subscription, the hub goes on.
	select {
	case <-sh.done:
	case <-time.After(10 * time.Second):
		s.mu.Unlock()
		t.Fatal("Close did not end the subscription in 10s")
	}
	s.mu.Unlock()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting after 10s")
	}
	select {
	case <-sh.exited:
	default:
		t.Fatal("Close returned before the hub's goroutine ended")
	}
	if n := h.numOpen(); n != 0 {
		t.Errorf("%d subscriptions open after the last subscriber closed, want 0", n)
	}
	noReceivers(t)
}

// TestRouteFilter: a subscriber's route filter keeps what it returns
// false for out of its queue; another subscriber of the same subscription
// gets everything.
func TestRouteFilter(t *testing.T) {
	path, addRoutes := routeNS(t)
	h := &Hub{}
	only := func(u netlink.RouteUpdate) bool {
		return u.Dst != nil && u.Dst.IP.To4() != nil && u.Dst.IP.To4()[3] == 7
	}
	filtered, err := h.Subscribe(path, Kinds{Routes: true}, only, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer filtered.Close()
	all := run(t, &Follower{Netns: path, Routes: true, Hub: h}, nil)
	defer all.stop()
	addRoutes(0, 100)
	all.routes(t, "the follower without filter", 100)
	// Updates are handed to every subscriber of one subscription at
	// once: the filtered one has all it will get.
	b, err := filtered.Take(maxBatch)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range b.Routes {
		got = append(got, u.Dst.String())
	}
	if !slices.Equal(got, []string{"10.99.0.7/32"}) {
		t.Errorf("the filtered subscriber got %v, want only 10.99.0.7/32", got)
	}
}
