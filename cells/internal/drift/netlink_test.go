package drift_test

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
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
	other := drift.NewLinkWitness(t, ns)

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
	drift.AddMarker(t, ns)
	drift.AwaitMarker(t, "the other subscriber", other.Updates)
	for _, err := range other.Errors() {
		t.Errorf("the other subscriber got an error: %v", err)
	}
}
