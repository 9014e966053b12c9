package clusterhealth

import (
	"net/http"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/pkg/apiv1"
)

func apiRoutes(db *statedb.DB, tbl statedb.Table[*NodeHealth], pr *prober) api.Routes {
	return api.NewRoutes(api.Route{Method: http.MethodGet, Path: apiv1.PathClusterHealth, Handler: func(r *http.Request) (any, error) {
		switch r.URL.Query().Get("probe") {
		case "":
		case "true":
			if err := pr.ProbeNow(r.Context()); err != nil {
				return nil, api.Errorf(http.StatusServiceUnavailable, "%v", err)
			}
		default:
			return nil, api.BadRequest("invalid probe=%q: want probe=true", r.URL.Query().Get("probe"))
		}
		rows := sortedRows(db.ReadTxn(), tbl)
		out := apiv1.ClusterHealth{Summary: Summary(rows), Nodes: []apiv1.NodeHealth{}}
		for _, r := range rows {
			out.Nodes = append(out.Nodes, apiv1.NodeHealth{Node: r.Node, Local: r.Local, Reachable: r.Reachable(),
				HostICMP: apiProbe(r.HostICMP), HostHTTP: apiProbe(r.HostHTTP), EndpointHTTP: apiProbe(r.EndpointHTTP), LastProbe: r.LastProbe})
		}
		return out, nil
	}})
}

func apiProbe(p Probe) apiv1.HealthProbe {
	if !p.probed() {
		return apiv1.HealthProbe{}
	}
	return apiv1.HealthProbe{Addr: p.Addr.String(), OK: p.OK, LatencySeconds: p.Latency.Seconds(), Error: p.Error}
}

// connectivity is cellium_node_connectivity_status and
// cellium_node_connectivity_latency_seconds, read from the table at each
// scrape, so a node that left has no series.
type connectivity struct {
	db              *statedb.DB
	tbl             statedb.Table[*NodeHealth]
	source          string
	status, latency *prometheus.Desc
}

func newMetrics(db *statedb.DB, tbl statedb.Table[*NodeHealth], node daemon.NodeName) metrics.Collectors {
	labels := []string{"source_node", "target_node", "type", "protocol"}
	return metrics.NewCollectors(&connectivity{db: db, tbl: tbl, source: string(node),
		status: prometheus.NewDesc("cellium_node_connectivity_status",
			"Whether the last probe of a path to a node answered (1) or not (0); type node or endpoint, protocol icmp or http", labels, nil),
		latency: prometheus.NewDesc("cellium_node_connectivity_latency_seconds",
			"Round trip of the last probe of a path to a node that answered", labels, nil),
	})
}

func (c *connectivity) Describe(ch chan<- *prometheus.Desc) { ch <- c.status; ch <- c.latency }

func (c *connectivity) Collect(ch chan<- prometheus.Metric) {
	for r := range c.tbl.All(c.db.ReadTxn()) {
		for _, p := range []struct {
			typ, proto string
			probe      Probe
		}{{"node", "icmp", r.HostICMP}, {"node", "http", r.HostHTTP}, {"endpoint", "http", r.EndpointHTTP}} {
			if !p.probe.probed() {
				continue
			}
			status := 0.0
			if p.probe.OK {
				status = 1
				ch <- prometheus.MustNewConstMetric(c.latency, prometheus.GaugeValue, p.probe.Latency.Seconds(), c.source, r.Node, p.typ, p.proto)
			}
			ch <- prometheus.MustNewConstMetric(c.status, prometheus.GaugeValue, status, c.source, r.Node, p.typ, p.proto)
		}
	}
}
