package k8sendpoints

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/metrics"
)

// endpointMetrics are the cell's figures.
type endpointMetrics struct {
	// refused counts the objects of other nodes refused, by reason:
	// each time an object is refused for a new reason.
	refused *prometheus.CounterVec
}

func newEndpointMetrics() *endpointMetrics {
	return &endpointMetrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cellium", Subsystem: "k8s_endpoints", Name: "refused_total",
		Help: "CelliumEndpoint objects of other nodes refused, by reason: identity, namespace, node, address",
	}, []string{"reason"})}
}

func newMetrics(m *endpointMetrics) metrics.Collectors { return metrics.NewCollectors(m.refused) }
