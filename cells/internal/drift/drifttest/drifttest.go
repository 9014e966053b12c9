// Package drifttest reads what the drift helpers count, for the tests of
// the cells that use them.
package drifttest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/internal/celltest"
)

// Repairs is cellium_kernel_repairs_total{module, object} in reg; 0 when
// nothing was counted.
func Repairs(t testing.TB, reg *prometheus.Registry, module, object string) float64 {
	t.Helper()
	v, _ := celltest.Value(t, reg, "cellium_kernel_repairs_total", "module", module, "object", object)
	return v
}
