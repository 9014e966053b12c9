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
// included; the repairs of this node's key; and the local-node job's
// counters.
func newMetrics(db *statedb.DB, tbl statedb.Table[*Node], repairs *kvsync.Repairs, local localMetrics) metrics.Collectors {
	return metrics.NewCollectors(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "cellium", Name: "nodes",
		Help: "Nodes of the cluster this agent knows, itself included",
	}, func() float64 { return float64(tbl.NumObjects(db.ReadTxn())) }), repairs, local.listings, local.specs)
}

// localMetrics are the local-node job's counters.
type localMetrics struct {
	// listings is cellium_node_route_listings_total: how often the job
	// listed the kernel's routes to find the device holding the default
	// route. Only a change that can move it (a default route, a device
	// holding one) makes the job list them; pods' veths and routes do
	// not.
	listings prometheus.Counter
	// specs is cellium_node_local_computations_total: how often the job
	// computed this node's description (pools, health endpoints,
	// addresses). A change of a health endpoint, of a device holding a
	// default route or its node addresses, or of a default route makes
	// one; pods' endpoints, devices and routes do not.
	specs prometheus.Counter
}

func newLocalMetrics() localMetrics {
	return localMetrics{
		listings: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "node", Name: "route_listings_total",
			Help: "Listings of the kernel's main routing table for the default routes that give this node its address, each after a change that could move them",
		}),
		specs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "cellium", Subsystem: "node", Name: "local_computations_total",
			Help: "Computations of this node's description (addresses, pod CIDRs, health addresses), each after a change of a health endpoint, a default route, or a device holding one or its addresses",
		}),
	}
}

func newRepairs() *kvsync.Repairs { return kvsync.NewRepairs("nodes") }
