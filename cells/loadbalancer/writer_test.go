package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func newTestWriter(t *testing.T) (*writer, *statedb.DB) {
	t.Helper()
	db := statedb.New()
	tables, err := newTables(db)
	if err != nil {
		t.Fatal(err)
	}
	health, _ := cell.NewSimpleHealth()
	return &writer{
		log: slog.New(slog.DiscardHandler), db: db, tables: tables, health: health, nodeName: "node-1",
		slices: sliceServices{}, problems: map[string]string{},
		contested: map[ServiceName]struct{}{},
	}, db
}

// listing is the events of an initial listing of n ClusterIP services and
// their slices of one endpoint, as the reflectors queue them.
func listing(n int) []k8sEvent {
	var evs []k8sEvent
	names := newListed(ServiceName.compare)
	ids := newListed(sliceID.compare)
	var sliceEvs []k8sEvent
	for i := range n {
		name := ServiceName{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}
		names.add(name)
		evs = append(evs, &serviceUpserted{svc: &Service{
			Name: name, Type: ServiceClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []ServicePort{{Port: 80, Protocol: TCP}},
		}})
		id := sliceID{Namespace: "default", Name: name.Name + "-1"}
		ids.add(id)
		sliceEvs = append(sliceEvs, &sliceUpserted{slice: &endpointSlice{id: id, service: name, backends: []Backend{{
			Address: L3n4Addr{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: 8080, Protocol: TCP},
			State:   BackendActive,
		}}}})
	}
	evs = append(evs, &servicesListed{names: names})
	return append(append(evs, sliceEvs...), &slicesListed{ids: ids})
}

// Once both listings are in, every listed service gets its frontends, a
// batch's worth per transaction, in the transactions that follow; a
// service deleted or added meanwhile, before or after those done, has the
// frontends it should; the table is initialized only at the end.
func TestFrontendsDrainedAfterListings(t *testing.T) {
	w, db := newTestWriter(t)
	ctx := context.Background()
	w.setNodeAddresses(ctx, nil, true)
	n := 2*maxBatch + 10
	evs := listing(n)
	apply := func(evs ...k8sEvent) {
		w.update(ctx, func(b *batch) {
			for _, ev := range evs {
				ev.apply(w, b)
			}
		})
	}
	frontendsOf := func(i int) int {
		return len(FrontendsOf(db.ReadTxn(), w.tables.frontends, &Service{
			Name:       ServiceName{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)},
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})},
			Ports:      []ServicePort{{Port: 80, Protocol: TCP}},
		}))
	}
	// The services, one of them deleted, and all but the last slice.
	apply(evs[:len(evs)-2]...)
	apply(&serviceDeleted{ServiceName{Namespace: "default", Name: "svc-7"}})
	if got := w.tables.frontends.NumObjects(db.ReadTxn()); got != 0 {
		t.Fatalf("%d frontends before the slices' listing is in, want none", got)
	}
	// The last slice, the listing's end and a new service: that batch's
	// services, then the others a batch at a time.
	extra := listing(n + 1)[n]
	apply(append(evs[len(evs)-2:], extra)...)
	batches := 1
	for ; ; batches++ {
		txn := db.ReadTxn()
		if init, _ := w.tables.frontends.Initialized(txn); init {
			break
		}
		if got := w.tables.frontends.NumObjects(txn); got > batches*maxBatch || batches > 10 {
			t.Fatalf("%d frontends after %d batches, want at most %d per batch", got, batches, maxBatch)
		}
		switch batches {
		case 1:
			// Before and after the services done: one listed,
			// one new, one deleted.
			apply(&serviceDeleted{ServiceName{Namespace: "default", Name: "svc-1"}}, &serviceDeleted{ServiceName{Namespace: "default", Name: "svc-999"}})
		case 2:
			apply(evs[1], evs[999])
		default:
			apply()
		}
	}
	if got := w.tables.frontends.NumObjects(db.ReadTxn()); got != n || batches != 3 {
		t.Errorf("%d frontends after %d batches, want %d (all but svc-7, and svc-%d) after 3", got, batches, n, n)
	}
	for i, want := range map[int]int{0: 1, 1: 1, 7: 0, 999: 1, n: 1, n - 1: 1} {
		if got := frontendsOf(i); got != want {
			t.Errorf("svc-%d has %d frontends, want %d", i, got, want)
		}
	}
}

// A batch applied after the agent began to stop is abandoned part way:
// nothing of it is committed.
func TestUpdateAbandonedWhenStopping(t *testing.T) {
	w, db := newTestWriter(t)
	evs := listing(2 * stoppingEvery)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.update(ctx, func(b *batch) {
		for _, ev := range evs {
			ev.apply(w, b)
		}
	})
	txn := db.ReadTxn()
	for name, n := range map[string]int{
		"services": w.tables.services.NumObjects(txn), "frontends": w.tables.frontends.NumObjects(txn),
	} {
		if n != 0 {
			t.Errorf("%d %s committed by an abandoned batch", n, name)
		}
	}
	if init, _ := w.tables.frontends.Initialized(txn); init {
		t.Error("frontends table initialized by an abandoned batch")
	}
}

// A listing arrives as events and is applied in batches of at most
// maxBatch, frontends included, yet the frontends table is initialized only
// once it holds every listed service's frontend.
func TestListingAppliedInBatches(t *testing.T) {
	w, db := newTestWriter(t)
	n := 3 * maxBatch
	events := make(chan k8sEvent, 2*n+2)
	for _, ev := range listing(n) {
		events <- ev
	}
	ctx, cancel := context.WithCancel(context.Background())
	// No node addresses: the third initializer of the frontends table.
	w.setNodeAddresses(ctx, nil, true)
	done := make(chan struct{})
	go func() { defer close(done); w.processEvents(ctx, events) }()
	defer func() { cancel(); <-done }()

	deadline := time.After(time.Minute)
	for {
		txn := db.ReadTxn()
		init, initWatch := w.tables.frontends.Initialized(txn)
		if init {
			if got := w.tables.frontends.NumObjects(txn); got != n {
				t.Fatalf("frontends table initialized with %d frontends, want all %d", got, n)
			}
			// Each row carries the revision of the transaction that
			// wrote it: the distinct revisions are the transactions,
			// however quickly they followed each other.
			revisions := map[statedb.Revision]int{}
			for _, rev := range w.tables.frontends.All(txn) {
				revisions[rev]++
			}
			for rev, rows := range revisions {
				if rows > maxBatch {
					t.Errorf("transaction %d wrote %d frontends, want at most %d", rev, rows, maxBatch)
				}
			}
			if len(revisions) < 2 {
				t.Errorf("the frontends of %d services came in %d transaction(s), want several of at most %d", n, len(revisions), maxBatch)
			}
			return
		}
		select {
		case <-initWatch:
		case <-deadline:
			t.Fatalf("frontends table not initialized after a minute")
		}
	}
}

// A listing that arrives while the agent stops is dropped, not converted
// and queued.
func TestListingDroppedWhenStopping(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	events := make(chan k8sEvent, 4*stoppingEvery)
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
	// With a live context the listing is queued: an upsert per service,
	// then its end.
	if err := serviceStore(context.Background(), events).Replace(list, "1"); err != nil {
		t.Fatal(err)
	}
	if len(events) != len(list)+1 {
		t.Fatalf("%d events queued for a listing of %d services, want %d", len(events), len(list), len(list)+1)
	}
	for range list {
		if _, ok := (<-events).(*serviceUpserted); !ok {
			t.Fatal("listing does not start with its services")
		}
	}
	if end, ok := (<-events).(*servicesListed); !ok || end.names.len() != len(list) {
		t.Errorf("listing does not end with the names of its %d services", len(list))
	}
}

// A listing's typed objects are let go one by one as they are converted:
// the store's slice no longer holds an object once its event is made.
func TestListingLetsObjectsGoAsConverted(t *testing.T) {
	var ks []*corev1.Service
	for i := range 3 {
		ks = append(ks, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}})
	}
	converted := 0
	evs, ok := convertListing(context.Background(), ks, func(k *corev1.Service) k8sEvent {
		for j, held := range ks {
			if j < converted && held != nil {
				t.Errorf("object %d still held while converting object %d", j, converted)
			}
		}
		converted++
		svc, invalid := convertService(k)
		return &serviceUpserted{svc, invalid}
	}, func() k8sEvent { return &servicesListed{} })
	if !ok || len(evs) != len(ks)+1 {
		t.Fatalf("convertListing: %d events, ok %v; want %d", len(evs), ok, len(ks)+1)
	}
	for j, held := range ks {
		if held != nil {
			t.Errorf("object %d still held after the listing was converted", j)
		}
	}
}

// In embedded mode a listing is streamed: the list call sends an upsert per
// service as it reads it and hands the Reflector an empty list of the
// listing's resource version, whose Replace then ends the listing with
// every name.
func TestStreamedListing(t *testing.T) {
	var objs []runtime.Object
	for i := range 3 {
		objs = append(objs, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("svc-%d", i)}})
	}
	cs, _, err := k8sclient.NewEmbedded(objs...)
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan k8sEvent, 8)
	store := serviceStore(context.Background(), events)
	list, ok, err := store.streamList(cs, corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service"),
		metav1.ListOptions{}, func(rv string) runtime.Object {
			return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}
		})
	if !ok || err != nil {
		t.Fatalf("streamList: handled %v, %v", ok, err)
	}
	if l := list.(*corev1.ServiceList); len(l.Items) != 0 || l.ResourceVersion == "" {
		t.Fatalf("the Reflector got %d items and resource version %q, want none and a version", len(l.Items), l.ResourceVersion)
	}
	if len(events) != len(objs) {
		t.Fatalf("%d events sent by the list call, want an upsert per service (%d)", len(events), len(objs))
	}
	for i := range objs {
		if up, ok := (<-events).(*serviceUpserted); !ok || up.svc.Name.Name != fmt.Sprintf("svc-%d", i) {
			t.Fatalf("event %d is not the upsert of svc-%d", i, i)
		}
	}
	if err := store.Replace(nil, list.(*corev1.ServiceList).ResourceVersion); err != nil {
		t.Fatal(err)
	}
	if end, ok := (<-events).(*servicesListed); !ok || end.names.len() != len(objs) {
		t.Fatalf("Replace did not end the listing with its %d names", len(objs))
	}
	// The next Replace is an ordinary listing again.
	if err := store.Replace([]any{objs[0]}, "2"); err != nil || len(events) != 2 {
		t.Fatalf("Replace after a streamed listing: %v, %d events, want an upsert and an end", err, len(events))
	}
	if _, ok, _ := store.streamList(nil, corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service"), metav1.ListOptions{}, nil); ok {
		t.Error("a list without an embedded server was streamed")
	}
}

// From a real API server a listing is asked for in pages (kubeclient's
// ListPages, which reads them), each object sent as it is decoded; the
// Reflector gets an empty list of the listing's resource version, and its
// Replace ends the listing with every page's names. A failure part way is
// the list's error.
func TestPagedListing(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	var calls []metav1.ListOptions
	events := make(chan k8sEvent, 16)
	list := func(_ context.Context, opts metav1.ListOptions, each func(*corev1.Service) error) (metav1.ListMeta, error) {
		calls = append(calls, opts)
		// One object, decoded into again for each item (ListEach).
		obj := &corev1.Service{}
		for i, name := range names {
			*obj = corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
			if err := each(obj); err != nil {
				return metav1.ListMeta{}, err
			}
			// Each object is sent as it is decoded.
			if sent := len(events); sent != i+1 {
				t.Errorf("%d upserts sent after object %d, want %d", sent, i, i+1)
			}
		}
		return metav1.ListMeta{ResourceVersion: "42"}, nil
	}
	emptyList := func(rv string) runtime.Object {
		return &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}
	}
	store := serviceStore(context.Background(), events)
	// As the Reflector's pager asks for a first listing.
	got, err := store.pagedList(context.Background(), metav1.ListOptions{ResourceVersion: "0", Limit: 500}, list, emptyList)
	if err != nil {
		t.Fatal(err)
	}
	if l := got.(*corev1.ServiceList); len(l.Items) != 0 || l.ResourceVersion != "42" {
		t.Fatalf("the Reflector got %d items and version %q, want none and 42", len(l.Items), l.ResourceVersion)
	}
	// "Any version" (0) is asked as the latest (""), which a server pages,
	// in pages of listPageSize, not the pager's 500: each page is a
	// request the client's rate limiter counts.
	want := []metav1.ListOptions{{Limit: listPageSize}}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("list calls %+v, want %+v", calls, want)
	}
	for _, name := range names {
		if up, ok := (<-events).(*serviceUpserted); !ok || up.svc.Name.Name != name {
			t.Fatalf("upserts out of order: want %s", name)
		}
	}
	if err := store.Replace(nil, "42"); err != nil {
		t.Fatal(err)
	}
	if end, ok := (<-events).(*servicesListed); !ok || end.names.len() != 4 {
		t.Fatal("Replace did not end the listing with its 4 names")
	}

	// A relist at the version last seen asks for pages not older than
	// it, never "exactly it" (what a limit with no match means).
	calls = nil
	if _, err := store.pagedList(context.Background(), metav1.ListOptions{ResourceVersion: "123"}, list, emptyList); err != nil {
		t.Fatal(err)
	}
	want = []metav1.ListOptions{{ResourceVersion: "123", ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, Limit: listPageSize}}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("relist calls %+v, want %+v", calls, want)
	}
	for range names {
		<-events
	}
	if err := store.Replace(nil, "42"); err != nil {
		t.Fatal(err)
	}
	<-events

	gone := errors.New("410: the continue token expired")
	failing := func(_ context.Context, _ metav1.ListOptions, each func(*corev1.Service) error) (metav1.ListMeta, error) {
		// The first page's objects, then the next page's error.
		if err := each(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a"}}); err != nil {
			return metav1.ListMeta{}, err
		}
		return metav1.ListMeta{}, gone
	}
	if _, err := store.pagedList(context.Background(), metav1.ListOptions{}, failing, emptyList); !errors.Is(err, gone) {
		t.Fatalf("a page failing part way: %v, want %v", err, gone)
	}
	for range len(events) {
		<-events
	}
	// The listing that failed does not end: the next Replace is an
	// ordinary one.
	if err := store.Replace([]any{&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a"}}}, "43"); err != nil || len(events) != 2 {
		t.Fatalf("Replace after a failed paged listing: %v, %d events, want an upsert and an end", err, len(events))
	}
}

// heldMaps stands in for lb-maps' Programmed: it holds the frontends at
// the addresses in held, whatever their content.
type heldMaps struct{ held map[L3n4Addr]bool }

func (m *heldMaps) Holds(fe *Frontend) bool { return m.held[fe.Address] }

func statusOf(t *testing.T, w *writer, db *statedb.DB, addr L3n4Addr) reconciler.StatusKind {
	t.Helper()
	fe, _, found := w.tables.frontends.Get(db.ReadTxn(), FrontendByAddress.Query(addr))
	if !found {
		t.Fatalf("no frontend at %s", addr)
	}
	return fe.Status.Kind()
}

// On a start, a frontend the maps hold already goes into the table Done,
// so that the reconciler neither compares it nor writes its status again;
// the others go in Pending. Only until the frontends table is first
// complete, and never at an address whose frontend was deleted before:
// the reconciler may still have that deletion to make.
func TestFrontendsTheMapsHoldGoInDone(t *testing.T) {
	w, db := newTestWriter(t)
	maps := &heldMaps{held: map[L3n4Addr]bool{}}
	w.programmed = maps
	n := maxBatch + 2
	evs := listing(n)
	addrOf := func(i int) L3n4Addr {
		return L3n4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Protocol: TCP}
	}
	// The maps hold every listed frontend but svc-1's.
	for i := range n {
		if i != 1 {
			maps.held[addrOf(i)] = true
		}
	}
	ctx := context.Background()
	w.setNodeAddresses(ctx, nil, true)
	// The listing up to its end, then its end: that transaction computes
	// maxBatch services' frontends; two wait for the next one.
	w.update(ctx, func(b *batch) {
		for _, ev := range evs[:len(evs)-1] {
			ev.apply(w, b)
		}
	})
	w.update(ctx, func(b *batch) { evs[len(evs)-1].apply(w, b) })
	if w.frontendsSynced {
		t.Fatalf("frontends synced after one transaction of %d services", n)
	}
	txn := db.ReadTxn()
	var early ServiceName
	for fe := range w.tables.frontends.All(txn) {
		switch kind := fe.Status.Kind(); {
		case fe.Address == addrOf(1):
			if kind != reconciler.StatusKindPending {
				t.Errorf("frontend %s, which the maps do not hold, is %s, want Pending", fe.Address, kind)
			}
		case kind != reconciler.StatusKindDone:
			t.Errorf("frontend %s, which the maps hold, is %s, want Done", fe.Address, kind)
		default:
			early = fe.ServiceName
		}
	}
	if early.Name == "" {
		t.Fatal("no frontend went in Done")
	}
	// The service of one of those frontends goes, and another takes its
	// address: that one goes in Pending, though the maps hold the address,
	// since the reconciler may have the deletion to make yet.
	svc, _, _ := w.tables.services.Get(txn, ServiceByName.Query(early))
	moved := &Service{Name: ServiceName{Namespace: "default", Name: "moved"}, Type: ServiceClusterIP,
		ClusterIPs: svc.ClusterIPs, Ports: svc.Ports}
	movedAddr := L3n4Addr{Addr: svc.ClusterIPs[0], Port: 80, Protocol: TCP}
	w.update(ctx, func(b *batch) {
		(&serviceDeleted{name: early}).apply(w, b)
		(&serviceUpserted{svc: moved}).apply(w, b)
	})
	if !w.frontendsSynced {
		t.Fatal("frontends not synced after the second transaction")
	}
	if kind := statusOf(t, w, db, movedAddr); kind != reconciler.StatusKindPending {
		t.Errorf("frontend at %s, deleted and taken again before the table synced, is %s, want Pending", movedAddr, kind)
	}
	// Once the table is complete, a new frontend goes in Pending even
	// where the maps hold one.
	late := L3n4Addr{Addr: netip.MustParseAddr("10.97.0.1"), Port: 80, Protocol: TCP}
	maps.held[late] = true
	w.update(ctx, func(b *batch) {
		(&serviceUpserted{svc: &Service{Name: ServiceName{Namespace: "default", Name: "late"}, Type: ServiceClusterIP,
			ClusterIPs: []netip.Addr{late.Addr}, Ports: []ServicePort{{Port: 80, Protocol: TCP}}}}).apply(w, b)
	})
	if kind := statusOf(t, w, db, late); kind != reconciler.StatusKindPending {
		t.Errorf("frontend %s added after the table synced is %s, want Pending", late, kind)
	}
	done := 0
	for fe := range w.tables.frontends.All(db.ReadTxn()) {
		if fe.Status.Kind() == reconciler.StatusKindDone {
			done++
		}
	}
	// Every listed service's frontend but svc-1's and the moved one's.
	if want := n - 2; done != want {
		t.Errorf("%d frontends Done, want %d", done, want)
	}
}
