package devices_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/internal/celltest"
)

// warnings is a slog.Handler that keeps the messages logged at warning
// level or above, and passes everything on to the test's log.
type warnings struct {
	slog.Handler
	mu   *sync.Mutex
	msgs *[]string
}

func (w warnings) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.mu.Lock()
		*w.msgs = append(*w.msgs, r.Message)
		w.mu.Unlock()
	}
	return w.Handler.Handle(ctx, r)
}

func (w warnings) WithAttrs(as []slog.Attr) slog.Handler {
	return warnings{w.Handler.WithAttrs(as), w.mu, w.msgs}
}

func (w warnings) WithGroup(g string) slog.Handler {
	return warnings{w.Handler.WithGroup(g), w.mu, w.msgs}
}

// TestMessagesOfOtherSocketsAreNoWarning: another program in the namespace
// that lists links through its subscription (netlink's ListExisting) sends
// its dump request to the links' multicast group too, so the watcher
// receives a message not from the kernel, which netlink reports as "Wrong
// sender portid" and drops. The watcher goes on and logs no warning.
func TestMessagesOfOtherSocketsAreNoWarning(t *testing.T) {
	ns := newTestNetns(t)
	var (
		mu   sync.Mutex
		msgs []string
	)
	log := slog.New(warnings{hivetest.Logger(t).Handler(), &mu, &msgs})
	a := &agent{}
	h := celltest.New(devices.Cell, cell.Invoke(func(db *statedb.DB, d statedb.Table[*devices.Device], n statedb.Table[*devices.NodeAddress]) {
		a.db, a.devices, a.addresses = db, d, n
	}))
	hive.AddConfigOverride(h, func(c *devices.Config) { c.DevicesNetns = ns.path })
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatalf("start hive: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Stop(log, context.Background()); err != nil {
			t.Errorf("stop hive: %v", err)
		}
	})
	a.waitInitialized(t)

	// The other program.
	handle, err := netns.GetFromPath(ns.path)
	must(t, err)
	defer handle.Close()
	done := make(chan struct{})
	other := make(chan netlink.LinkUpdate, 64)
	must(t, netlink.LinkSubscribeWithOptions(other, done, netlink.LinkSubscribeOptions{Namespace: &handle, ListExisting: true}))
	defer func() {
		close(done)
		for range other {
		}
	}()

	// Once the watcher has a change made after the dump request, it has
	// received the request too.
	must(t, ns.addVeth("after0", "after1"))
	a.waitFor(t, func(txn statedb.ReadTxn) (bool, string) {
		_, _, found := a.devices.Get(txn, devices.DeviceName.Query("after0"))
		return found, "after0 not in the devices table"
	})
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		t.Errorf("logged at warning level: %s", m)
	}
}
