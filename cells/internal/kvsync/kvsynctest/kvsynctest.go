// Package kvsynctest reads what the kvsync helpers report, for the tests of
// the cells that use them.
package kvsynctest

import (
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the collectors the cells of a test hive contribute (the
// group the metrics cell registers); take them with cell.Invoke.
type Metrics struct {
	cell.In

	Collectors []prometheus.Collector `group:"metrics"`
}

// Repairs is cellium_kvstore_repairs_total{module} among m's collectors.
func (m Metrics) Repairs(t testing.TB, module string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	for _, c := range m.Collectors {
		if err := reg.Register(c); err != nil {
			t.Fatalf("register collector: %v", err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "cellium_kvstore_repairs_total" {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "module" && l.GetValue() == module {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no cellium_kvstore_repairs_total{module=%q}", module)
	return 0
}
