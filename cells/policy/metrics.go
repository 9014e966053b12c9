package policy

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
)

// entriesPerEndpoint is cellium_policy_entries{endpoint}: the desired
// policy entries of each local endpoint, counted when scraped, so an
// endpoint that goes leaves no series behind.
type entriesPerEndpoint struct {
	p    *Policy
	desc *prometheus.Desc
}

func newMetrics(p *Policy) metrics.Collectors {
	return metrics.NewCollectors(p.computeSeconds, &entriesPerEndpoint{p: p,
		desc: prometheus.NewDesc("cellium_policy_entries", "Desired policy entries of each local endpoint", []string{"endpoint"}, nil)})
}

func (c *entriesPerEndpoint) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *entriesPerEndpoint) Collect(ch chan<- prometheus.Metric) {
	counts := map[uint16]int{}
	txn := c.p.db.ReadTxn()
	for enf := range c.p.enforcement.All(txn) {
		counts[enf.EndpointID] = 0
	}
	for e := range c.p.entries.All(txn) {
		counts[e.Key.EndpointID]++
	}
	for id, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), strconv.Itoa(int(id)))
	}
}
