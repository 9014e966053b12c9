package drift

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/pkg/nettest"
)

// A message another socket sends to the links' multicast group (a program
// listing through its subscription, netlink's ListExisting, as root)
// reaches the Follower's subscription too. netlink reports it as "Wrong
// sender portid" and drops it: it is no failure, so it is not the error
// the subscription's end is explained with.
func TestOtherSocketsMessageIsNoSubscriptionError(t *testing.T) {
	n := nettest.NewNS(t)
	ns, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatalf("open %s: %v", n.Path(), err)
	}
	defer ns.Close()

	s := &subscription{done: make(chan struct{})}
	if err := s.start(ns, true, false, false); err != nil {
		t.Fatal(err)
	}
	defer s.close()

	// A witness beside it in the group, which keeps what netlink reports.
	var (
		mu      sync.Mutex
		reports []error
		done    = make(chan struct{})
		witness = make(chan netlink.LinkUpdate, 64)
	)
	err = netlink.LinkSubscribeWithOptions(witness, done, netlink.LinkSubscribeOptions{
		Namespace: &ns,
		ErrorCallback: func(err error) {
			mu.Lock()
			reports = append(reports, err)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("subscribe the witness: %v", err)
	}
	defer func() {
		close(done)
		for range witness {
		}
	}()

	// The other program.
	otherDone := make(chan struct{})
	other := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(other, otherDone, netlink.LinkSubscribeOptions{Namespace: &ns, ListExisting: true}); err != nil {
		t.Fatalf("subscribe the other program: %v", err)
	}
	defer func() {
		close(otherDone)
		for range other {
		}
	}()

	// A change made after the dump request: once a subscriber has it, it
	// has received the request before.
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("handle: %v", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "marker0"}, PeerName: "marker1"}); err != nil {
		t.Fatalf("add marker0: %v", err)
	}
	awaitMarker := func(who string, ch <-chan netlink.LinkUpdate) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case u := <-ch:
				if u.Attrs().Name == "marker0" {
					return
				}
			case <-deadline:
				t.Fatalf("%s did not see marker0 after 10s", who)
			}
		}
	}
	awaitMarker("the witness", witness)
	awaitMarker("the subscription", s.links)

	mu.Lock()
	foreign := 0
	for _, err := range reports {
		if FromOtherSocket(err) {
			foreign++
		}
	}
	mu.Unlock()
	if foreign == 0 {
		t.Fatalf("the witness got no message of another socket (reports %v): the test did not make one", reports)
	}
	if err := s.ended("link"); strings.Contains(err.Error(), "portid") {
		t.Errorf("the subscription's end says %q, want no message of another socket in it", err)
	}
}
