package health_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	"github.com/spf13/pflag"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/pkg/apiv1"
)

type widget struct {
	Name   string
	Status reconciler.Status
}

func (w *widget) TableHeader() []string { return []string{"Name"} }
func (w *widget) TableRow() []string    { return []string{w.Name} }

var widgetName = statedb.Index[*widget, string]{
	Name:       "name",
	FromObject: func(w *widget) index.KeySet { return index.NewKeySet(index.String(w.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// flakyOps fails every write until works is set: a kernel that refuses.
type flakyOps struct{ works *atomic.Bool }

func (o flakyOps) Update(context.Context, statedb.ReadTxn, statedb.Revision, *widget) error {
	if !o.works.Load() {
		return errors.New("map full")
	}
	return nil
}
func (flakyOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *widget) error {
	return nil
}
func (flakyOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*widget, statedb.Revision]) error {
	return nil
}

// TestWaits runs the two kinds of contributed barrier: a table that waits
// for its initializers, and a table whose objects must all be reconciled.
// Each keeps the agent not ready, says what it waits for, turns into a
// health error naming it after --readiness-timeout, and lets the agent be
// ready once passed.
func TestWaits(t *testing.T) {
	var (
		db        *statedb.DB
		readiness *health.Readiness
		statuses  statedb.Table[*health.Status]
		widgets   statedb.RWTable[*widget]
		synced    func(statedb.WriteTxn)
		works     atomic.Bool
	)
	h := celltest.New(
		cell.Module("widgets", "Test module with two readiness waits",
			cell.ProvidePrivate(
				job.Registry.NewGroup,
				func(db *statedb.DB) (statedb.RWTable[*widget], error) {
					tbl, err := statedb.NewTable(db, "widgets", widgetName)
					if err != nil {
						return nil, err
					}
					txn := db.WriteTxn(tbl)
					synced = tbl.RegisterInitializer(txn, "widget-sync")
					txn.Commit()
					return tbl, nil
				},
				func(p reconciler.Params, tbl statedb.RWTable[*widget]) (reconciler.Reconciler[*widget], error) {
					return reconciler.Register(p, tbl,
						func(w *widget) *widget { c := *w; return &c },
						func(w *widget, s reconciler.Status) *widget { w.Status = s; return w },
						func(w *widget) reconciler.Status { return w.Status },
						flakyOps{&works}, nil,
						reconciler.WithRetry(10*time.Millisecond, 50*time.Millisecond))
				},
			),
			cell.Provide(
				func(db *statedb.DB, tbl statedb.RWTable[*widget]) health.WaitOut {
					return health.TablesInitialized("widgets-synced", db, tbl)
				},
			),
			cell.Provide(
				func(db *statedb.DB, tbl statedb.RWTable[*widget], _ reconciler.Reconciler[*widget]) health.WaitOut {
					return health.Reconciled("widgets-written", db, tbl.ToTable(), func(w *widget) reconciler.Status { return w.Status })
				},
			),
			cell.Invoke(func(d *statedb.DB, r *health.Readiness, s statedb.Table[*health.Status], tbl statedb.RWTable[*widget]) {
				db, readiness, statuses, widgets = d, r, s, tbl
			}),
		),
	)
	// celltest overrides health.Config already; a flag sets the timeout.
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse([]string{"--readiness-timeout=300ms"}); err != nil {
		t.Fatal(err)
	}
	celltest.Start(t, h)

	waitFor := func(what string, cond func(hz apiv1.Healthz) bool) apiv1.Healthz {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			hz, watch := readiness.Status()
			if cond(hz) {
				return hz
			}
			select {
			case <-watch:
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s; readiness: %+v", what, hz)
			}
		}
	}
	barrier := func(hz apiv1.Healthz, name string) (apiv1.Barrier, bool) {
		i := slices.IndexFunc(hz.Waiting, func(b apiv1.Barrier) bool { return b.Name == name })
		if i < 0 {
			return apiv1.Barrier{}, false
		}
		return hz.Waiting[i], true
	}

	// Both wait for the table's initializer, and say so.
	hz := waitFor("both barriers to name the initializer", func(hz apiv1.Healthz) bool {
		a, okA := barrier(hz, "widgets-synced")
		b, okB := barrier(hz, "widgets-written")
		return hz.Started && okA && okB && strings.Contains(a.Detail, "widget-sync") && strings.Contains(b.Detail, "widget-sync")
	})
	if hz.Ready {
		t.Fatal("ready while both barriers are pending")
	}

	// Overdue: the health module names both.
	healthError := func(substr ...string) {
		t.Helper()
		celltest.Eventually(t, "readiness health error naming "+strings.Join(substr, ", "), func() (bool, string) {
			st, _, found := statuses.Get(db.ReadTxn(), health.StatusID.Query("health.job-readiness-timeout"))
			if !found || st.Level != cell.StatusDegraded {
				return false, fmt.Sprintf("found %v: %+v", found, st)
			}
			for _, s := range substr {
				if !strings.Contains(st.Error, s) {
					return false, fmt.Sprintf("%+v", st)
				}
			}
			return true, ""
		})
	}
	healthError("widgets-synced", "widgets-written")

	// Synced with one object that cannot be written: the table barrier
	// passes, the reconciled one keeps waiting and stays overdue.
	txn := db.WriteTxn(widgets)
	widgets.Insert(txn, &widget{Name: "a", Status: reconciler.StatusPending()})
	synced(txn)
	txn.Commit()
	hz = waitFor("widgets-synced to pass", func(hz apiv1.Healthz) bool {
		_, pending := barrier(hz, "widgets-synced")
		b, _ := barrier(hz, "widgets-written")
		return !pending && strings.Contains(b.Detail, "failed to reconcile")
	})
	if hz.Ready || !slices.Equal(hz.Pending, []string{"widgets-written"}) {
		t.Fatalf("with the object failing: pending %v, want only widgets-written", hz.Pending)
	}
	healthError("widgets-written (waiting")

	// The kernel takes it on retry: ready, and healthy again.
	works.Store(true)
	waitFor("ready", func(hz apiv1.Healthz) bool { return hz.Ready })
	celltest.Eventually(t, "readiness health back to OK", func() (bool, string) {
		st, _, found := statuses.Get(db.ReadTxn(), health.StatusID.Query("health.job-readiness-timeout"))
		return found && st.Level == cell.StatusOK, fmt.Sprintf("found %v: %+v", found, st)
	})
}
