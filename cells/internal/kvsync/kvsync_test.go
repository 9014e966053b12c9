package kvsync

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestRepairsOfEveryModule: the modules' repair counters share one name
// and register side by side in one registry, as in the agent.
func TestRepairsOfEveryModule(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, m := range []string{"nodes", "ipcache", "identity"} {
		r := NewRepairs(m)
		r.Inc()
		if err := reg.Register(r); err != nil {
			t.Fatalf("register the repairs of %s: %v", m, err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || families[0].GetName() != "cellium_kvstore_repairs_total" || len(families[0].Metric) != 3 {
		t.Fatalf("gathered %v, want cellium_kvstore_repairs_total with one series per module", families)
	}
}
