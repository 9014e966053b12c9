package health

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
)

// Wait is a readiness barrier a cell contributes without holding a
// function to call: the agent is not ready until Until returns nil. Cells
// contribute waits to the value group "readiness-waits" with [WaitOut]; the
// health cell runs each in a job of its own from the start of the hive.
type Wait struct {
	// Name is the barrier's name in the readiness table, /readyz and
	// `agent status`.
	Name string
	// Until blocks until the barrier is passed and returns nil, or returns
	// ctx's error when ctx ends first. It may call progress with a short
	// description of what it still waits for; `agent status` shows the
	// latest one. An error other than ctx's is retried.
	Until func(ctx context.Context, progress func(detail string)) error
}

// WaitOut contributes a Wait to the readiness barriers.
type WaitOut struct {
	cell.Out
	Wait Wait `group:"readiness-waits"`
}

// detailRefresh is how often a pending wait looks again at what it waits
// for when nothing it can watch changed.
const detailRefresh = time.Second

// TablesInitialized is a Wait that passes once every table is initialized:
// the usual barrier of a table filled by a restore or an initial sync, whose
// initializers say what it still waits for.
func TablesInitialized(name string, db *statedb.DB, tables ...statedb.TableMeta) WaitOut {
	return WaitOut{Wait: Wait{Name: name, Until: func(ctx context.Context, progress func(string)) error {
		for {
			var pending []string
			var watches []<-chan struct{}
			txn := db.ReadTxn()
			for _, tbl := range tables {
				init, watch := tbl.Initialized(txn)
				if init {
					continue
				}
				pending = append(pending, fmt.Sprintf("table %s waits for %s", tbl.Name(), strings.Join(tbl.PendingInitializers(txn), ", ")))
				watches = append(watches, watch)
			}
			if len(pending) == 0 {
				return nil
			}
			progress(strings.Join(pending, "; "))
			// One table at a time is enough: the loop looks at them all
			// again when the first one is initialized. Its initializers
			// finishing one by one close no channel: the detail is
			// refreshed every second.
			select {
			case <-watches[0]:
			case <-time.After(detailRefresh):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}}}
}

// Reconciled is a Wait that passes once tbl is initialized and every
// object it holds has been reconciled without error (status Done): "in
// the kernel", not only "in the table". An object that failed waits for a
// retry to succeed; one rewritten meanwhile waits for its new version.
// status reads the status of the reconciler in question (a table may have
// several). Objects without a status (never marked Pending) are not the
// reconciler's and do not count.
func Reconciled[Obj any](name string, db *statedb.DB, tbl statedb.Table[Obj], status func(Obj) reconciler.Status) WaitOut {
	initialized := TablesInitialized(name, db, tbl).Wait.Until
	written := RowsReconciled(name, db, tbl, status).Wait.Until
	return WaitOut{Wait: Wait{Name: name, Until: func(ctx context.Context, progress func(string)) error {
		if err := initialized(ctx, progress); err != nil {
			return err
		}
		return written(ctx, progress)
	}}}
}

// RowsReconciled is Reconciled without the table's initialization: it
// passes once every object tbl holds has been reconciled without error,
// initialized or not. The statedb reconciler writes the objects of a table
// not yet initialized (restored, or claimed locally) as they come; only
// its pruning waits for the initialization. It is the part of Reconciled
// that a table whose initialization cannot happen now (its source is away)
// can still be waited for.
func RowsReconciled[Obj any](name string, db *statedb.DB, tbl statedb.Table[Obj], status func(Obj) reconciler.Status) WaitOut {
	return WaitOut{Wait: Wait{Name: name, Until: func(ctx context.Context, progress func(string)) error {
		for {
			all, watch := tbl.AllWatch(db.ReadTxn())
			var total, pending, failed int
			var firstError string
			for obj := range all {
				total++
				switch st := status(obj); st.Kind {
				case reconciler.StatusKindPending:
					pending++
				case reconciler.StatusKindError:
					if failed == 0 {
						firstError = st.GetError()
					}
					failed++
				}
			}
			if pending == 0 && failed == 0 {
				return nil
			}
			detail := fmt.Sprintf("table %s: %d of %d objects pending", tbl.Name(), pending, total)
			if failed > 0 {
				detail += fmt.Sprintf(", %d failed to reconcile and wait for a retry (%s)", failed, firstError)
			}
			progress(detail)
			// Every status the reconciler writes closes watch; looking at
			// most every reconciledRecheck keeps a table of 100,000 objects
			// being written from being scanned 100,000 times.
			select {
			case <-watch:
			case <-ctx.Done():
				return ctx.Err()
			}
			select {
			case <-time.After(reconciledRecheck):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}}}
}

// reconciledRecheck is the least time between two scans of a reconciled
// table.
const reconciledRecheck = 100 * time.Millisecond

type waitsParams struct {
	cell.In

	Readiness *Readiness
	Jobs      job.Group
	Waits     []Wait `group:"readiness-waits"`
}

// startWaits adds a barrier for each contributed Wait and a job that
// completes it.
func startWaits(p waitsParams) {
	for _, w := range p.Waits {
		done := p.Readiness.Add(w.Name)
		progress := func(detail string) { p.Readiness.setDetail(w.Name, detail) }
		p.Jobs.Add(job.OneShot("wait-"+w.Name, func(ctx context.Context, h cell.Health) error {
			h.OK("Waiting")
			if err := w.Until(ctx, progress); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("readiness barrier %s: %w", w.Name, err)
			}
			done()
			h.OK("Done")
			return nil
		}, job.WithRetry(-1, &job.ExponentialBackoff{Min: time.Second, Max: time.Minute})))
	}
}
