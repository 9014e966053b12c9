package drift_test

import (
	"testing"

	"github.com/cilium/hive/hivetest"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cellium/cellium/cells/internal/drift"
	"github.com/cellium/cellium/cells/internal/drift/drifttest"
)

// TestRepairsOfSeveralModules: every module registers its own collector of
// cellium_kernel_repairs_total in the one registry of the agent, and the
// counts stay apart by module and object.
func TestRepairsOfSeveralModules(t *testing.T) {
	reg := prometheus.NewRegistry()
	log := hivetest.Logger(t)
	routing, masq := drift.NewRepairs(log, "routing"), drift.NewRepairs(log, "masquerade")
	for _, r := range []*drift.Repairs{routing, masq} {
		for _, c := range r.Collectors().Collectors {
			if err := reg.Register(c); err != nil {
				t.Fatalf("register: %v", err)
			}
		}
	}
	routing.Repaired("route", "10.244.2.0/24 via 10.244.2.0 dev cellium_vxlan onlink")
	routing.Repaired("route", "10.244.3.0/24 via 10.244.3.0 dev cellium_vxlan onlink")
	masq.Repaired("nft", "created table inet cellium")
	for _, c := range []struct {
		module, object string
		want           float64
	}{{"routing", "route", 2}, {"routing", "nft", 0}, {"masquerade", "nft", 1}, {"masquerade", "route", 0}} {
		if got := drifttest.Repairs(t, reg, c.module, c.object); got != c.want {
			t.Errorf("repairs{module=%s,object=%s} = %v, want %v", c.module, c.object, got, c.want)
		}
	}
}
