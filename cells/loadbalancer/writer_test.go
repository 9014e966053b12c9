package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A listing applied after the agent began to stop is abandoned part way:
// nothing of it is committed, and the writer does not finish it first.
func TestUpdateAbandonedWhenStopping(t *testing.T) {
	db := statedb.New()
	tables, err := newTables(db)
	if err != nil {
		t.Fatal(err)
	}
	health, _ := cell.NewSimpleHealth()
	w := &writer{
		log: slog.New(slog.DiscardHandler), db: db, tables: tables, health: health,
		slices: map[sliceID]string{}, problems: map[string]string{},
		contested: map[ServiceName]struct{}{}, deferred: map[ServiceName]struct{}{},
	}
	listing := &servicesListed{}
	for i := range 10 * stoppingEvery {
		listing.services = append(listing.services, serviceUpserted{svc: &Service{
			Name: ServiceName{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}, Type: ServiceClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []ServicePort{{Port: 80, Protocol: TCP}},
		}})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	applied := 0
	w.update(ctx, func(b *batch) {
		listing.apply(w, b)
		applied = len(b.dirty)
	})
	if applied >= len(listing.services) {
		t.Errorf("all %d services of the listing applied after the context ended, want it cut short", applied)
	}
	txn := db.ReadTxn()
	if n := tables.services.NumObjects(txn); n != 0 {
		t.Errorf("%d services committed from an abandoned listing", n)
	}
	if init, _ := tables.services.Initialized(txn); init {
		t.Error("services table initialized by an abandoned listing")
	}

	// The same listing with a live context applies whole.
	w.update(context.Background(), func(b *batch) { listing.apply(w, b) })
	if n := tables.services.NumObjects(db.ReadTxn()); n != len(listing.services) {
		t.Errorf("%d services after the listing, want %d", n, len(listing.services))
	}
}

// A listing that arrives while the agent stops is dropped, not converted
// and queued.
func TestListingDroppedWhenStopping(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	events := make(chan k8sEvent, 1)
	var list []any
	for i := range 2 * stoppingEvery {
		list = append(list, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}})
	}
	if err := serviceStore(ctx, events).Replace(list, "1"); !errors.Is(err, context.Canceled) {
		t.Errorf("Replace after the context ended: %v, want %v", err, context.Canceled)
	}
	if len(events) != 0 {
		t.Errorf("%d events queued from a listing dropped on stop", len(events))
	}
	// With a live context the listing is queued whole.
	if err := serviceStore(context.Background(), events).Replace(list, "1"); err != nil {
		t.Fatal(err)
	}
	if ev := (<-events).(*servicesListed); len(ev.services) != len(list) {
		t.Errorf("listing of %d services queued with %d", len(list), len(ev.services))
	}
}
