package drift

import (
	"strings"
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

	s, err := (&Hub{}).Subscribe(n.Path(), Kinds{Links: true}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// A witness beside it in the group.
	witness := NewLinkWitness(t, ns)

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

	// A change made after the dump request.
	AddMarker(t, ns)
	AwaitMarker(t, "the witness", witness.Updates)
	awaitTakenMarker(t, s)

	foreign := 0
	for _, err := range witness.Errors() {
		if FromOtherSocket(err) {
			foreign++
		}
	}
	if foreign == 0 {
		t.Fatalf("the witness got no message of another socket (reports %v): the test did not make one", witness.Errors())
	}
	sh := s.shares[0]
	sh.mu.Lock()
	reported := sh.err
	sh.mu.Unlock()
	if reported != nil && strings.Contains(reported.Error(), "portid") {
		t.Errorf("the subscription's end would say %q, want no message of another socket in it", reported)
	}
}

// awaitTakenMarker takes s's updates, 10 s at most, until marker0's.
func awaitTakenMarker(t *testing.T, s *Subscriber) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-s.Ready():
			b, err := s.Take(maxBatch)
			if err != nil {
				t.Fatalf("the subscriber's updates ended: %v", err)
			}
			for _, u := range b.Links {
				if u.Attrs().Name == "marker0" {
					return
				}
			}
		case <-deadline:
			t.Fatal("the subscriber did not see marker0 after 10s")
		}
	}
}
