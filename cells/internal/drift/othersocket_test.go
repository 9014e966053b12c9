package drift

import (
	"strings"
	"testing"

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
	AwaitMarker(t, "the subscription", s.links)

	foreign := 0
	for _, err := range witness.Errors() {
		if FromOtherSocket(err) {
			foreign++
		}
	}
	if foreign == 0 {
		t.Fatalf("the witness got no message of another socket (reports %v): the test did not make one", witness.Errors())
	}
	if err := s.ended("link"); strings.Contains(err.Error(), "portid") {
		t.Errorf("the subscription's end says %q, want no message of another socket in it", err)
	}
}
