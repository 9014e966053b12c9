package drift_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/pkg/nettest"
)

// okHealth is the cell.Health a Follower reports to; it only says OK.
type okHealth struct{ cell.Health }

func (okHealth) OK(string) {}

// TestFollowerListsWithoutDisturbingOtherSubscribers: a Follower's listing
// of the devices reaches its Handle first, and no other link subscriber in
// the namespace (the devices watcher is one) receives anything but the
// kernel's messages. Listing through the subscription (netlink's
// ListExisting) multicast the dump request to them, and each reported
// "Wrong sender portid".
func TestFollowerListsWithoutDisturbingOtherSubscribers(t *testing.T) {
	n := nettest.NewNS(t)
	ns, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatalf("open %s: %v", n.Path(), err)
	}
	defer ns.Close()

	// The other subscriber.
	var (
		mu     sync.Mutex
		errs   []error
		done   = make(chan struct{})
		others = make(chan netlink.LinkUpdate, 64)
	)
	err = netlink.LinkSubscribeWithOptions(others, done, netlink.LinkSubscribeOptions{
		Namespace: &ns,
		ErrorCallback: func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer func() {
		close(done)
		for range others {
		}
	}()

	batches := make(chan drift.Batch, 16)
	f := &drift.Follower{Netns: n.Path(), Links: true, Handle: func(_ context.Context, b drift.Batch) { batches <- b }}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- f.Run(ctx, okHealth{}) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	select {
	case b := <-batches:
		if len(b.Links) != 1 || b.Links[0].Attrs().Name != "lo" || b.Links[0].Index != int32(b.Links[0].Attrs().Index) {
			t.Fatalf("first batch %+v, want the listing: lo, with its index", b.Links)
		}
	case err := <-ran:
		t.Fatalf("Run ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no batch after 10s")
	}

	// A change after the listing: once the other subscriber has it, it
	// has every message sent to it before.
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("handle: %v", err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "marker0"}, PeerName: "marker1"}); err != nil {
		t.Fatalf("add marker0: %v", err)
	}
	deadline := time.After(10 * time.Second)
	for seen := false; !seen; {
		select {
		case u := <-others:
			seen = u.Attrs().Name == "marker0"
		case <-deadline:
			t.Fatal("the other subscriber did not see marker0 after 10s")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, err := range errs {
		t.Errorf("the other subscriber got an error: %v", err)
	}
}
