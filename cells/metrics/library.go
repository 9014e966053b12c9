package metrics

import (
	"strings"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	"github.com/prometheus/client_golang/prometheus"
)

// hiveMetrics implements hive.Metrics: how long populating, starting and
// stopping the graph took.
type hiveMetrics struct {
	populate, start, stop prometheus.Gauge
}

type hiveMetricsOut struct {
	cell.Out

	Metrics    hive.Metrics
	Collectors []prometheus.Collector `group:"metrics,flatten"`
}

func newHiveMetrics() hiveMetricsOut {
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "hive", Name: name, Help: help})
	}
	m := &hiveMetrics{
		populate: gauge("populate_duration_seconds", "Time to construct the cell graph"),
		start:    gauge("start_duration_seconds", "Time to run every start hook"),
		stop:     gauge("stop_duration_seconds", "Time to run every stop hook"),
	}
	return hiveMetricsOut{Metrics: m, Collectors: []prometheus.Collector{m.populate, m.start, m.stop}}
}

func (m *hiveMetrics) PopulateDuration(d time.Duration) { m.populate.Set(d.Seconds()) }
func (m *hiveMetrics) StartDuration(d time.Duration)    { m.start.Set(d.Seconds()) }
func (m *hiveMetrics) StopDuration(d time.Duration)     { m.stop.Set(d.Seconds()) }

// reconcilerMetrics implements reconciler.Metrics for every reconciler in the
// agent, labelled by module and reconciler name.
type reconcilerMetrics struct {
	duration      *prometheus.HistogramVec
	errors        *prometheus.CounterVec
	currentErrors *prometheus.GaugeVec
	pruneDuration *prometheus.HistogramVec
	pruneErrors   *prometheus.CounterVec
}

type reconcilerMetricsOut struct {
	cell.Out

	Metrics    reconciler.Metrics
	Collectors []prometheus.Collector `group:"metrics,flatten"`
}

func newReconcilerMetrics() reconcilerMetricsOut {
	const sub = "reconciler"
	labels := []string{"module", "reconciler"}
	m := &reconcilerMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: sub, Name: "duration_seconds",
			Help:    "Duration of reconciliation rounds by operation (update, delete)",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, append(labels, "op")),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: sub, Name: "errors_total",
			Help: "Objects that failed to reconcile",
		}, labels),
		currentErrors: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: sub, Name: "current_errors",
			Help: "Objects currently failing to reconcile and waiting for retry",
		}, labels),
		pruneDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: sub, Name: "prune_duration_seconds",
			Help:    "Duration of prune (full reconciliation) rounds",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, labels),
		pruneErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: sub, Name: "prune_errors_total",
			Help: "Failed prune rounds",
		}, labels),
	}
	return reconcilerMetricsOut{Metrics: m, Collectors: []prometheus.Collector{
		m.duration, m.errors, m.currentErrors, m.pruneDuration, m.pruneErrors,
	}}
}

func reconcilerLabels(moduleID cell.FullModuleID, name string) []string {
	if name == "" {
		name = moduleID.String()
	}
	return []string{moduleID.String(), name}
}

func (m *reconcilerMetrics) ReconciliationDuration(moduleID cell.FullModuleID, name, op string, d time.Duration) {
	m.duration.WithLabelValues(append(reconcilerLabels(moduleID, name), op)...).Observe(d.Seconds())
}

func (m *reconcilerMetrics) ReconciliationErrors(moduleID cell.FullModuleID, name string, new, current int) {
	labels := reconcilerLabels(moduleID, name)
	m.errors.WithLabelValues(labels...).Add(float64(new))
	m.currentErrors.WithLabelValues(labels...).Set(float64(current))
}

func (m *reconcilerMetrics) PruneError(moduleID cell.FullModuleID, name string, err error) {
	if err != nil {
		m.pruneErrors.WithLabelValues(reconcilerLabels(moduleID, name)...).Inc()
	}
}

func (m *reconcilerMetrics) PruneDuration(moduleID cell.FullModuleID, name string, d time.Duration) {
	m.pruneDuration.WithLabelValues(reconcilerLabels(moduleID, name)...).Observe(d.Seconds())
}

// statedbMetrics implements statedb.Metrics: per-table object counts and
// write transaction timings.
type statedbMetrics struct {
	objects, graveyard, revision, deleteTrackers *prometheus.GaugeVec
	lockWait, txnDuration                        *prometheus.HistogramVec
}

type statedbMetricsOut struct {
	cell.Out

	Metrics    statedb.Metrics
	Collectors []prometheus.Collector `group:"metrics,flatten"`
}

func newStateDBMetrics() statedbMetricsOut {
	const sub = "statedb"
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: sub, Name: name, Help: help}, []string{"table"})
	}
	histogram := func(name, help, label string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: sub, Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10),
		}, []string{label})
	}
	m := &statedbMetrics{
		objects:        gauge("objects", "Objects in the table"),
		graveyard:      gauge("graveyard_objects", "Deleted objects kept until every observer has seen the deletion"),
		revision:       gauge("revision", "Current revision of the table"),
		deleteTrackers: gauge("delete_trackers", "Observers of the table's deletions"),
		lockWait:       histogram("table_lock_wait_seconds", "Time a write transaction waited for the table lock", "table"),
		txnDuration:    histogram("write_txn_duration_seconds", "Time write transactions held their tables", "tables"),
	}
	return statedbMetricsOut{Metrics: m, Collectors: []prometheus.Collector{
		m.objects, m.graveyard, m.revision, m.deleteTrackers, m.lockWait, m.txnDuration,
	}}
}

func (m *statedbMetrics) WriteTxnTableAcquisition(_ string, table string, d time.Duration) {
	m.lockWait.WithLabelValues(table).Observe(d.Seconds())
}

// WriteTxnTotalAcquisition is covered by the per-table lock wait.
func (m *statedbMetrics) WriteTxnTotalAcquisition(string, []string, time.Duration) {}

func (m *statedbMetrics) WriteTxnDuration(_ string, tables []string, d time.Duration) {
	m.txnDuration.WithLabelValues(strings.Join(tables, ",")).Observe(d.Seconds())
}

// GraveyardLowWatermark and GraveyardCleaningDuration matter only when
// debugging StateDB itself.
func (m *statedbMetrics) GraveyardLowWatermark(string, statedb.Revision)  {}
func (m *statedbMetrics) GraveyardCleaningDuration(string, time.Duration) {}

func (m *statedbMetrics) GraveyardObjectCount(table string, n int) {
	m.graveyard.WithLabelValues(table).Set(float64(n))
}

func (m *statedbMetrics) ObjectCount(table string, n int) {
	m.objects.WithLabelValues(table).Set(float64(n))
}

func (m *statedbMetrics) DeleteTrackerCount(table string, n int) {
	m.deleteTrackers.WithLabelValues(table).Set(float64(n))
}

func (m *statedbMetrics) Revision(table string, rev statedb.Revision) {
	m.revision.WithLabelValues(table).Set(float64(rev))
}
