// Package drift helps the cells that write the kernel put right what was
// changed behind the agent's back, without a restart.
//
// The contract:
//
//   - A cell follows the kernel's change events for what it owns
//     (Follower: netlink link, route and neighbour updates in one network
//     namespace; NFTables: the nftables monitor) and, for an event that
//     undoes one of its objects, marks that object's row Refreshing
//     (Rows.Refresh) or has its reconciler prune. The generic reconciler
//     then compares with the kernel and writes only what is missing or
//     different: a refresh of a kernel that is right writes nothing.
//   - An Update that writes for a Refreshing row (or a prune that writes)
//     is a repair: it says so
//     with Repairs.Repaired, which logs a warning naming what was put back
//     and counts it in cellium_kernel_repairs_total{module, object}. A
//     cell that deletes what it finds and has no place for (an entry left
//     by a crash) says so with Repairs.Removed, counted the same way.
//   - Events can be lost (the kernel drops them when a reader falls
//     behind): a subscription that fails is made again, and its first
//     batch is a Resync, on which the cell refreshes every row. The
//     reconciler's periodic refresh is the backstop for changes the kernel
//     sends no event for.
//
// Example, in a cell whose reconciler writes routes:
//
//	f := &drift.Follower{Routes: true, Handle: func(_ context.Context, b drift.Batch) {
//		rows.Refresh(func(r *Route) bool { return b.Resync || deleted(b, r) })
//	}}
//	jobs.Add(job.OneShot("drift", f.Run, drift.Retry))
//	// in Update: if r.Status.Kind == reconciler.StatusKindRefreshing { repairs.Repaired("route", desc) }
package drift

import (
	"log/slog"
	"time"

	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
)

// Repairs logs and counts the kernel objects a module put back.
type Repairs struct {
	log   *slog.Logger
	total *prometheus.CounterVec
}

// NewRepairs counts the repairs of module as
// cellium_kernel_repairs_total{module="<module>", object="..."}. Every
// module registers its own collector (metrics.Collectors), under the same
// name with its module label.
func NewRepairs(log *slog.Logger, module string) *Repairs {
	return &Repairs{log: log, total: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cellium", Name: "kernel_repairs_total",
		Help:        "Kernel objects the agent put back after they were removed or changed behind its back, or removed as left over, by module and kind of object",
		ConstLabels: prometheus.Labels{"module": module},
	}, []string{"object"})}
}

// Collectors are r's collectors, for a cell's metrics.
func (r *Repairs) Collectors() metrics.Collectors { return metrics.NewCollectors(r.total) }

// Repaired logs that what, one kernel object of kind object (route, neigh,
// fdb, link, nft, ...), was put back, and counts it.
func (r *Repairs) Repaired(object, what string) {
	r.total.WithLabelValues(object).Inc()
	r.log.Warn("Put back kernel state changed behind the agent's back", "object", object, "what", what)
}

// Removed logs that what, one kernel object of kind object in where (a
// map, a table), was deleted because the module's state has no place for
// it (why), and counts it as a repair: an entry left by a crash or
// written behind the agent's back.
func (r *Repairs) Removed(object, what, where, why string) {
	r.total.WithLabelValues(object).Inc()
	r.log.Warn("Removed kernel state the agent does not account for", "object", object, "what", what, "where", where, "why", why)
}

// Rows is a table that the generic reconciler writes into the kernel.
type Rows[T any] struct {
	DB    *statedb.DB
	Table statedb.RWTable[T]
	// Clone, SetStatus and Status are those given to reconciler.Register.
	Clone     func(T) T
	SetStatus func(T, reconciler.Status) T
	Status    func(T) reconciler.Status
}

// Refresh marks the rows that match Refreshing, in one transaction, so
// that the reconciler compares them with the kernel again. Only Done rows
// are marked: a pending row is on its way, a failed one is being retried.
// It returns how many it marked.
func (r Rows[T]) Refresh(match func(T) bool) int {
	txn := r.DB.WriteTxn(r.Table)
	defer txn.Commit()
	n := 0
	for row := range r.Table.All(txn) {
		if r.Status(row).Kind != reconciler.StatusKindDone || !match(row) {
			continue
		}
		r.Table.Insert(txn, r.SetStatus(r.Clone(row), reconciler.StatusRefreshing()))
		n++
	}
	return n
}

// IsRepair says whether an Update of a row with status s that had to
// write put back drift: a Refreshing row is one the kernel had, whose
// desired state did not change.
func IsRepair(s reconciler.Status) bool { return s.Kind == reconciler.StatusKindRefreshing }

// Retry is how a Follower's job is retried after its subscription failed.
var Retry = job.WithRetry(-1, &job.ExponentialBackoff{Min: 100 * time.Millisecond, Max: 30 * time.Second})
