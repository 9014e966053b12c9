// Package kvsynctest reads what the kvsync helpers report, for the tests of
// the cells that use them.
package kvsynctest

import (
	"testing"

	"github.com/cellium/cellium/cells/internal/celltest"
)

// Metrics are the collectors the cells of a test hive contribute; take
// them with cell.Invoke.
type Metrics = celltest.Metrics

// Repairs is cellium_kvstore_repairs_total{module} among m's collectors.
func Repairs(t testing.TB, m Metrics, module string) float64 {
	t.Helper()
	v, ok := m.Value(t, "cellium_kvstore_repairs_total", "module", module)
	if !ok {
		t.Fatalf("no cellium_kvstore_repairs_total{module=%q}", module)
	}
	return v
}
