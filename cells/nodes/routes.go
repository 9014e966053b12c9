package nodes

import (
	"net/http"

	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/internal/kvsync"
	"github.com/cellium/cellium/cells/metrics"
	"github.com/cellium/cellium/pkg/apiv1"
)

func apiRoutes(db *statedb.DB, tbl statedb.Table[*Node]) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathNodes, Handler: func(*http.Request) (any, error) {
			out := []apiv1.Node{}
			for n := range tbl.All(db.ReadTxn()) {
				out = append(out, apiNode(n))
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathNodes + "/{name}", Handler: func(r *http.Request) (any, error) {
			n, _, found := tbl.Get(db.ReadTxn(), ByName.Query(r.PathValue("name")))
			if !found {
				return nil, api.NotFound("no node %q", r.PathValue("name"))
			}
			return apiNode(n), nil
		}},
	)
}

func apiNode(n *Node) apiv1.Node {
	out := apiv1.Node{Name: n.Name, Local: n.Local, Source: n.Source.String(), Problems: n.Problems}
	for _, a := range n.Addresses {
		out.Addresses = append(out.Addresses, apiv1.NodeAddress{Type: string(a.Type), IP: a.IP.String()})
	}
	for _, p := range n.PodCIDRs {
		out.PodCIDRs = append(out.PodCIDRs, p.String())
	}
	for _, ip := range n.HealthIPs {
		out.HealthIPs = append(out.HealthIPs, ip.String())
	}
	return out
}

// newMetrics is cellium_nodes: the nodes of the table, the local one
// included; the repairs of this node's key; and the listings of the
// default routes.
func newMetrics(db *statedb.DB, tbl statedb.Table[*Node], repairs *kvsync.Repairs, listings routeListings) metrics.Collectors {
	return metrics.NewCollectors(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "cellium", Name: "nodes",
		Help: "Nodes of the cluster this agent knows, itself included",
	}, func() float64 { return float64(tbl.NumObjects(db.ReadTxn())) }), repairs, listings)
}

// routeListings is cellium_node_route_listings_total: how often the
// local-node job listed the kernel's routes to find the device holding
// the default route. Only a change that can move it (a default route, a
// device holding one) makes the job list them; pods' veths and routes
// do not.
type routeListings struct{ prometheus.Counter }

func newRouteListings() routeListings {
	return routeListings{prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "node", Name: "route_listings_total",
		Help: "Listings of the kernel's main routing table for the default routes that give this node its address, each after a change that could move them",
	})}
}

func newRepairs() *kvsync.Repairs { return kvsync.NewRepairs("nodes") }
