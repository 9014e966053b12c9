package kvstore

import (
	"context"
	"errors"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/polltest"
)

// never is a barrier that passes only when its context ends.
var never = health.Wait{Name: "never", Until: func(ctx context.Context, _ func(string)) error {
	<-ctx.Done()
	return ctx.Err()
}}

// passed is a barrier that passes at once.
var passed = health.Wait{Name: "passed", Until: func(context.Context, func(string)) error { return nil }}

func noProgress(string) {}

// TestUnlessUnreachable: a barrier on etcd is its written part once etcd
// has failed to answer, and the whole barrier while the kvstore is
// connected (after an outage too) or disabled.
func TestUnlessUnreachable(t *testing.T) {
	log := hivetest.Logger(t)
	etcd := etcdtest.Start(t)
	etcd.Stop()
	c := startClient(t, etcd.Endpoint(), "ready", nil)

	if err := UnlessUnreachable(never, passed, c, log).Until(ctxT(t), noProgress); err != nil {
		t.Fatalf("with etcd away: %v, want passed", err)
	}
	if s := c.Status(); !unreachable(s) {
		t.Fatalf("passed with status %+v", s)
	}

	etcd.Restart()
	polltest.Until(t, "connected", 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		s := c.Status()
		return s.State == StateConnected, string(s.State)
	})
	// Three looks at the status: a connected client excuses nothing,
	// though its last error is still that of the outage.
	ctx, cancel := context.WithTimeout(context.Background(), 3*UnreachableRecheck)
	defer cancel()
	if err := UnlessUnreachable(never, passed, c, log).Until(ctx, noProgress); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("connected: %v, want the inner wait's deadline", err)
	}
	boom := errors.New("boom")
	failing := health.Wait{Name: "failing", Until: func(context.Context, func(string)) error { return boom }}
	if err := UnlessUnreachable(failing, passed, c, log).Until(ctxT(t), noProgress); !errors.Is(err, boom) {
		t.Fatalf("connected, inner failing: %v, want its error", err)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 3*UnreachableRecheck)
	defer cancel()
	if err := UnlessUnreachable(never, passed, disabled{}, log).Until(ctx, noProgress); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("disabled: %v, want the inner wait's deadline", err)
	}
}

// heldRow is a row of a table etcd initializes, reconciled by heldOps.
type heldRow struct {
	Name   string
	Status reconciler.Status
}

func (r *heldRow) TableHeader() []string { return []string{"Name"} }
func (r *heldRow) TableRow() []string    { return []string{r.Name} }

var heldRowName = statedb.Index[*heldRow, string]{
	Name:       "name",
	FromObject: func(r *heldRow) index.KeySet { return index.NewKeySet(index.String(r.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// heldOps writes a row only once release is closed: a datapath the test
// holds. written names the rows it wrote.
type heldOps struct {
	release chan struct{}
	mu      sync.Mutex
	written map[string]bool
}

func (o *heldOps) Update(ctx context.Context, _ statedb.ReadTxn, _ statedb.Revision, r *heldRow) error {
	select {
	case <-o.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.written[r.Name] = true
	return nil
}
func (o *heldOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *heldRow) error {
	return nil
}
func (o *heldOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*heldRow, statedb.Revision]) error {
	return nil
}

func (o *heldOps) wrote(name string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.written[name]
}

// TestReconciledUnlessUnreachable: with etcd unreachable, a reconciled
// barrier on a table etcd initializes does not wait for the table's
// initialization, but still for the rows it holds (restored, claimed
// locally) to be written: ready implies the datapath has them.
func TestReconciledUnlessUnreachable(t *testing.T) {
	log := hivetest.Logger(t)
	etcd := etcdtest.Start(t)
	etcd.Stop()
	c := startClient(t, etcd.Endpoint(), "ready-rows", nil)

	ops := &heldOps{release: make(chan struct{}), written: map[string]bool{}}
	var (
		db  *statedb.DB
		tbl statedb.RWTable[*heldRow]
	)
	h := celltest.New(cell.Module("held-rows", "Table initialized by etcd and written by a held reconciler",
		cell.ProvidePrivate(
			job.Registry.NewGroup,
			func(db *statedb.DB) (statedb.RWTable[*heldRow], error) {
				tbl, err := statedb.NewTable(db, "held-rows", heldRowName)
				if err != nil {
					return nil, err
				}
				// The etcd listing's initializer, never done: etcd is away.
				txn := db.WriteTxn(tbl)
				tbl.RegisterInitializer(txn, "kvstore-listing")
				txn.Commit()
				return tbl, nil
			},
			func(p reconciler.Params, tbl statedb.RWTable[*heldRow]) (reconciler.Reconciler[*heldRow], error) {
				return reconciler.Register(p, tbl,
					func(r *heldRow) *heldRow { c := *r; return &c },
					func(r *heldRow, s reconciler.Status) *heldRow { r.Status = s; return r },
					func(r *heldRow) reconciler.Status { return r.Status },
					ops, nil)
			},
		),
		cell.Invoke(func(d *statedb.DB, t statedb.RWTable[*heldRow], _ reconciler.Reconciler[*heldRow]) {
			db, tbl = d, t
		}),
	))
	celltest.Start(t, h)

	// A restored row, in the table before etcd could answer.
	txn := db.WriteTxn(tbl)
	tbl.Insert(txn, &heldRow{Name: "restored", Status: reconciler.StatusPending()})
	txn.Commit()

	var (
		mu     sync.Mutex
		detail string
	)
	progress := func(d string) {
		mu.Lock()
		defer mu.Unlock()
		detail = d
	}
	result := make(chan error, 1)
	wait := ReconciledUnlessUnreachable("held-written", db, tbl.ToTable(), func(r *heldRow) reconciler.Status { return r.Status }, c, log)
	go func() { result <- wait.Until(ctxT(t), progress) }()

	// etcd unreachable, the row Pending: not passed, and it says what for.
	polltest.Until(t, "the barrier waiting for the row without the kvstore", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		select {
		case err := <-result:
			t.Fatalf("barrier returned %v with etcd away and the restored row pending (status %+v)", err, c.Status())
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(detail, "without the kvstore") && strings.Contains(detail, "1 of 1 objects pending"), detail
	})
	if s := c.Status(); !unreachable(s) {
		t.Fatalf("waiting for the rows alone with status %+v", s)
	}

	// The datapath takes the row: passed, with the row written and the
	// table still not initialized.
	close(ops.release)
	if err := <-result; err != nil {
		t.Fatalf("barrier with the row written: %v", err)
	}
	if !ops.wrote("restored") {
		t.Fatal("barrier passed before the restored row was written")
	}
	rtxn := db.ReadTxn()
	if r, _, _ := tbl.Get(rtxn, heldRowName.Query("restored")); r.Status.Kind != reconciler.StatusKindDone {
		t.Fatalf("barrier passed with the row %+v", r)
	}
	if init, _ := tbl.Initialized(rtxn); init {
		t.Fatal("table initialized: the test's etcd listing never ends")
	}
}
