package health

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"

	"github.com/cellium/cellium/pkg/apiv1"
)

// Barrier is one row of the "readiness" table: something the agent waits for
// before it reports ready.
type Barrier struct {
	Name string `json:"name"`
	Done bool   `json:"done"`
	// Since is when Done last changed: while not done, since when the
	// agent waits for it.
	Since time.Time `json:"since"`
	// Detail is what a pending barrier still waits for, when it says.
	Detail string `json:"detail,omitempty"`
}

var _ statedb.TableWritable = &Barrier{}

func (b *Barrier) TableHeader() []string { return []string{"Name", "Done", "Since", "Detail"} }

func (b *Barrier) TableRow() []string {
	return []string{b.Name, fmt.Sprint(b.Done), sinceString(b.Since), b.Detail}
}

var (
	// BarrierName indexes the readiness table by barrier name.
	BarrierName = statedb.Index[*Barrier, string]{
		Name:       "name",
		FromObject: func(b *Barrier) index.KeySet { return index.NewKeySet(index.String(b.Name)) },
		FromKey:    index.String,
		FromString: index.FromString,
		Unique:     true,
	}
	// BarrierDone indexes the readiness table by whether a barrier is done.
	BarrierDone = statedb.Index[*Barrier, bool]{
		Name:       "done",
		FromObject: func(b *Barrier) index.KeySet { return index.NewKeySet(index.Bool(b.Done)) },
		FromKey:    index.Bool,
		FromString: index.BoolString,
	}
)

// ReadinessTableName is the name of the readiness table.
const ReadinessTableName = "readiness"

// cellsStarted is the barrier that StartedMarker completes.
const cellsStarted = "cells-started"

// Readiness gates the agent's readiness. See the package documentation.
type Readiness struct {
	db      *statedb.DB
	tbl     statedb.RWTable[*Barrier]
	timeout time.Duration
	// everStarted is set once every cell of this run has started, and
	// never cleared.
	everStarted atomic.Bool
}

// StartCompleted says whether every cell of this run has started, even if
// the hive is stopping now. A stop hook that finds it false is undoing a
// start that failed or was interrupted.
func (r *Readiness) StartCompleted() bool { return r.everStarted.Load() }

func newReadiness(db *statedb.DB, cfg Config) (*Readiness, error) {
	tbl, err := statedb.NewTable(db, ReadinessTableName, BarrierName, BarrierDone)
	if err != nil {
		return nil, err
	}
	r := &Readiness{db: db, tbl: tbl, timeout: cfg.ReadinessTimeout}
	r.Add(cellsStarted)
	return r, nil
}

// Add registers a barrier that keeps the agent not ready until the returned
// function is called. Call Add from a constructor, so the barrier exists
// before anything can report ready. Calling done more than once is harmless.
// Names are unique: adding one twice is a programming error and panics.
func (r *Readiness) Add(name string) (done func()) {
	txn := r.db.WriteTxn(r.tbl)
	defer txn.Abort()
	if _, _, found := r.tbl.Get(txn, BarrierName.Query(name)); found {
		panic(fmt.Sprintf("health: readiness barrier %q added twice", name))
	}
	r.tbl.Insert(txn, &Barrier{Name: name, Since: time.Now()})
	txn.Commit()
	return func() { r.set(name, true) }
}

func (r *Readiness) set(name string, done bool) {
	txn := r.db.WriteTxn(r.tbl)
	defer txn.Abort()
	old, _, found := r.tbl.Get(txn, BarrierName.Query(name))
	if !found || old.Done == done {
		return
	}
	r.tbl.Insert(txn, &Barrier{Name: name, Done: done, Since: time.Now()})
	txn.Commit()
}

// setDetail records what a pending barrier waits for.
func (r *Readiness) setDetail(name, detail string) {
	txn := r.db.WriteTxn(r.tbl)
	defer txn.Abort()
	old, _, found := r.tbl.Get(txn, BarrierName.Query(name))
	if !found || old.Done || old.Detail == detail {
		return
	}
	b := *old
	b.Detail = detail
	r.tbl.Insert(txn, &b)
	txn.Commit()
}

// Status says whether every cell has started and which barriers are pending,
// since when and what for. The returned channel closes when the answer may
// have changed; how long each has waited changes without closing it.
func (r *Readiness) Status() (apiv1.Healthz, <-chan struct{}) {
	txn := r.db.ReadTxn()
	pending, watch := r.tbl.ListWatch(txn, BarrierDone.Query(false))
	hz := apiv1.Healthz{Started: true}
	now := time.Now()
	for b := range pending {
		if b.Name == cellsStarted {
			hz.Started = false
		}
		hz.Pending = append(hz.Pending, b.Name)
		waited := now.Sub(b.Since)
		hz.Waiting = append(hz.Waiting, apiv1.Barrier{
			Name: b.Name, Since: b.Since, WaitedSeconds: waited.Seconds(), Detail: b.Detail,
			Overdue: r.timeout > 0 && waited >= r.timeout,
		})
	}
	hz.Ready = len(hz.Pending) == 0
	return hz, watch
}

// Wait returns once the agent is ready (every cell started, every barrier
// done), or ctx's error if ctx ends first.
func (r *Readiness) Wait(ctx context.Context) error {
	for {
		hz, changed := r.Status()
		if hz.Ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// watchTimeouts reports the barriers that have waited longer than
// --readiness-timeout as a health error naming them, and OK again once none
// has. A barrier that never completes then shows in `agent status` and the
// log instead of only keeping the node not ready.
func (r *Readiness) watchTimeouts(ctx context.Context, h cell.Health) error {
	if r.timeout <= 0 {
		h.OK("Readiness timeout disabled (--readiness-timeout=0)")
		return nil
	}
	for {
		hz, watch := r.Status()
		var overdue []string
		next := time.Duration(-1)
		for _, b := range hz.Waiting {
			waited := time.Duration(b.WaitedSeconds * float64(time.Second))
			if b.Overdue {
				what := fmt.Sprintf("%s (waiting %s", b.Name, waited.Truncate(time.Second))
				if b.Detail != "" {
					what += ": " + b.Detail
				}
				overdue = append(overdue, what+")")
			} else if left := r.timeout - waited; next < 0 || left < next {
				next = left
			}
		}
		switch {
		case len(overdue) > 0:
			h.Degraded(fmt.Sprintf("Readiness barriers not done after --readiness-timeout %s", r.timeout),
				fmt.Errorf("not done after %s: %s", r.timeout, strings.Join(overdue, "; ")))
		case hz.Ready:
			h.OK("Ready")
		default:
			h.OK(fmt.Sprintf("Waiting for %s", strings.Join(hz.Pending, ", ")))
		}
		// Without a barrier left to become overdue, only a change of the
		// table can change the answer.
		timer := time.NewTimer(max(next, 0))
		if next < 0 {
			timer.Stop()
		}
		select {
		case <-watch:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil
		}
		timer.Stop()
	}
}

// StartedMarker completes the "cells-started" barrier. It must be the last
// cell of a hive: its start hook then runs after every other cell's, which is
// what "every cell has started" means. On stop it runs first and takes the
// barrier back, so the agent stops reporting ready as soon as it begins to
// shut down.
var StartedMarker = cell.Invoke(appendStartedMarker)

func appendStartedMarker(lc cell.Lifecycle, r *Readiness) {
	lc.Append(&startedMarker{r})
}

type startedMarker struct{ r *Readiness }

func (m *startedMarker) Start(cell.HookContext) error {
	m.r.everStarted.Store(true)
	m.r.set(cellsStarted, true)
	return nil
}
func (m *startedMarker) Stop(cell.HookContext) error { m.r.set(cellsStarted, false); return nil }
func (m *startedMarker) HookInfo() string            { return "readiness: every cell has started" }
