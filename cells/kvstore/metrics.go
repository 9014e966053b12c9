package kvstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
)

// kvMetrics are the kvstore's figures, under cellium_kvstore_.
type kvMetrics struct {
	duration      *prometheus.HistogramVec
	quorumErrors  prometheus.Counter
	leasesLost    prometheus.Counter
	leasedKeys    prometheus.GaugeFunc
	locksReleased prometheus.Counter
	storeReplaced prometheus.Counter
	relists       *prometheus.CounterVec
}

func newKVMetrics(c Client) (*kvMetrics, metrics.Collectors) {
	const ns, sub = "cellium", "kvstore"
	m := &kvMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "operation_duration_seconds",
			Help:    "Duration of kvstore operations, by operation (get, list, create, update, delete, txn, lock) and result (ok, error)",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"operation", "result"}),
		quorumErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "quorum_errors_total",
			Help: "Status checks that reached etcd but got no linearizable answer",
		}),
		leasesLost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "lease_renewals_failed_total",
			Help: "Leases lost while the agent ran (their keys were written again on a new lease)",
		}),
		leasedKeys: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "leased_keys",
			Help: "Keys this agent holds on its leases",
		}, func() float64 { return float64(c.Status().LeasedKeys) }),
		locksReleased: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "stale_locks_released_total",
			Help: "Locks released by kvstore-locks-gc because they were held too long",
		}),
		storeReplaced: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "store_replaced_total",
			Help: "Times etcd was found replaced (another cluster ID, or a revision below one read before): restored from a backup, or rebuilt",
		}),
		relists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watch_relists_total",
			Help: "Watches listed again, by reason (broken, compacted, store-replaced)",
		}, []string{"reason"}),
	}
	return m, metrics.NewCollectors(m.duration, m.quorumErrors, m.leasesLost, m.leasedKeys, m.locksReleased, m.storeReplaced, m.relists)
}

// observe records an operation that started at start and ended with
// *err: deferred, it reads err when the operation returns.
func (m *kvMetrics) observe(op string, start time.Time, err *error) {
	if m == nil {
		return
	}
	result := "ok"
	if *err != nil {
		result = "error"
	}
	m.duration.WithLabelValues(op, result).Observe(time.Since(start).Seconds())
}
