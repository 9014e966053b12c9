package ipcache

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/metrics"
)

// newMetrics is cellium_ipcache_entries: the prefixes of the table, which
// the map holds once reconciled.
// It also carries the repairs of this node's ip/v1 keys.
func newMetrics(db *statedb.DB, tbl statedb.Table[*Entry], repairs *kvsync.Repairs) metrics.Collectors {
	return metrics.NewCollectors(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "cellium", Subsystem: "ipcache", Name: "entries",
		Help: "Prefixes in the ipcache (and, once reconciled, its BPF map)",
	}, func() float64 { return float64(tbl.NumObjects(db.ReadTxn())) }), repairs)
}

func newRepairs() *kvsync.Repairs { return kvsync.NewRepairs("ipcache") }
