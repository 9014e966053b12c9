package metrics_test

import (
	"context"
	"iter"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/metrics"
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

type nopOps struct{}

func (nopOps) Update(context.Context, statedb.ReadTxn, statedb.Revision, *widget) error { return nil }
func (nopOps) Delete(context.Context, statedb.ReadTxn, statedb.Revision, *widget) error { return nil }
func (nopOps) Prune(context.Context, statedb.ReadTxn, iter.Seq2[*widget, statedb.Revision]) error {
	return nil
}

// TestLibraryMetrics checks that a reconciler, StateDB and the hive report
// into the registry without being told to, and that cells' collectors land
// there too.
func TestLibraryMetrics(t *testing.T) {
	var (
		reg     *prometheus.Registry
		db      *statedb.DB
		widgets statedb.RWTable[*widget]
		rec     reconciler.Reconciler[*widget]
	)
	custom := prometheus.NewCounter(prometheus.CounterOpts{Name: "cellium_test_widgets_total", Help: "test"})
	h := celltest.New(
		metrics.Cell,
		cell.Module("widgets", "Test reconciler",
			cell.ProvidePrivate(job.Registry.NewGroup),
			cell.Provide(func() metrics.Collectors { return metrics.NewCollectors(custom) }),
			cell.Invoke(func(p reconciler.Params, r *prometheus.Registry) (err error) {
				reg, db = r, p.DB
				if widgets, err = statedb.NewTable(p.DB, "widgets", widgetName); err != nil {
					return err
				}
				rec, err = reconciler.Register(p, widgets,
					func(w *widget) *widget { c := *w; return &c },
					func(w *widget, s reconciler.Status) *widget { w.Status = s; return w },
					func(w *widget) reconciler.Status { return w.Status },
					nopOps{}, nil)
				return err
			}),
		),
	)
	celltest.Start(t, h)
	custom.Inc()

	txn := db.WriteTxn(widgets)
	widgets.Insert(txn, &widget{Name: "a", Status: reconciler.StatusPending()})
	rev := widgets.Revision(txn)
	txn.Commit()
	if _, _, err := rec.WaitUntilReconciled(context.Background(), rev); err != nil {
		t.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range families {
		have[f.GetName()] = true
	}
	for _, name := range []string{
		"cellium_hive_start_duration_seconds",
		"cellium_reconciler_duration_seconds",
		"cellium_statedb_write_txn_duration_seconds",
		"cellium_test_widgets_total",
		"go_goroutines",
	} {
		if !have[name] {
			t.Errorf("registry lacks %s", name)
		}
	}
	if got := testutil.ToFloat64(custom); got != 1 {
		t.Errorf("contributed counter = %v, want 1", got)
	}
	// The reconciler's histogram is labelled by module.
	var found bool
	for _, f := range families {
		if f.GetName() != "cellium_reconciler_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "module" && strings.Contains(l.GetValue(), "widgets") {
					found = true
				}
			}
		}
	}
	if !found {
		t.Error("reconciler duration has no series for module widgets")
	}
}

func TestDuplicateCollectorFailsPopulate(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "cellium_dup_total", Help: "dup"})
	h := celltest.New(metrics.Cell,
		cell.Provide(func() metrics.Collectors { return metrics.NewCollectors(c, c) }),
		cell.Invoke(func(*prometheus.Registry) {}))
	err := h.Populate(hivetest.Logger(t))
	if err == nil || !strings.Contains(err.Error(), "register metrics collector") {
		t.Fatalf("populate with a duplicate collector = %v, want an error", err)
	}
}
