package celltest

import (
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the collectors the cells of a test hive contribute (the
// group the metrics cell registers); take them with cell.Invoke and read
// them with Value.
type Metrics struct {
	cell.In

	Collectors []prometheus.Collector `group:"metrics"`
}

// registry registers m's collectors in a registry of their own, or says
// which one does not register.
func (m Metrics) registry() (prometheus.Gatherer, error) {
	reg := prometheus.NewPedanticRegistry()
	for _, c := range m.Collectors {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// Value is m's counter or gauge name with labels (name, value pairs; a
// series may have more), and whether there is one.
func (m Metrics) Value(t testing.TB, name string, labels ...string) (float64, bool) {
	t.Helper()
	g, err := m.registry()
	if err != nil {
		t.Fatalf("register the hive's collectors: %v", err)
	}
	return Value(t, g, name, labels...)
}

// Value is g's counter or gauge name with labels (name, value pairs; a
// series may have more), and whether there is one.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("labels of %s: %q is not name, value pairs", name, labels)
	}
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if v, ok := have[labels[i]]; !ok || v != labels[i+1] {
					continue series
				}
			}
			switch {
			case s.GetCounter() != nil:
				return s.GetCounter().GetValue(), true
			case s.GetGauge() != nil:
				return s.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}
