package identity

import (
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/metrics"
)

// identitiesByKind is cellium_identities{kind}: the rows of the identities
// table by kind, counted when scraped.
type identitiesByKind struct {
	db   *statedb.DB
	tbl  statedb.Table[*Identity]
	desc *prometheus.Desc
}

func newMetrics(db *statedb.DB, tbl statedb.Table[*Identity], repairs *kvsync.Repairs, a *Allocator) metrics.Collectors {
	cs := []prometheus.Collector{&identitiesByKind{db: db, tbl: tbl,
		desc: prometheus.NewDesc("cellium_identities", "Security identities the node knows, by kind (reserved, cluster, local)", []string{"kind"}, nil)}, repairs}
	if a.crd != nil {
		// Every request for the custom resources (this cell's and
		// k8s-endpoints', which share the client).
		cs = append(cs, a.crd.client.Requests())
	}
	return metrics.NewCollectors(cs...)
}

func newRepairs() *kvsync.Repairs { return kvsync.NewRepairs("identity") }

func (c *identitiesByKind) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *identitiesByKind) Collect(ch chan<- prometheus.Metric) {
	counts := map[Kind]int{KindReserved: 0, KindCluster: 0, KindLocal: 0}
	for id := range c.tbl.All(c.db.ReadTxn()) {
		counts[id.Kind]++
	}
	for kind, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), string(kind))
	}
}
