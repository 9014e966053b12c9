// Package drifttest reads what the drift helpers count, for the tests of
// the cells that use them.
package drifttest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Repairs is cellium_kernel_repairs_total{module, object} in reg; 0 when
// nothing was counted.
func Repairs(t testing.TB, reg *prometheus.Registry, module, object string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "cellium_kernel_repairs_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["module"] == module && labels["object"] == object {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
