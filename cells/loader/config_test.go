package loader

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cellium/cellium/bpf"
)

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.LBMode = "direct" }, `invalid --lb-mode "direct": want snat or dsr`},
		{func(c *Config) { c.LBMode = "" }, `invalid --lb-mode "": want snat or dsr`},
		{func(c *Config) { c.LBMode = "DSR" }, `invalid --lb-mode "DSR": want snat or dsr`},
		{func(c *Config) { c.LBDSRMapMax = 0 }, "invalid --lb-dsr-map-max 0: want at least 1"},
		{func(c *Config) { c.LBNodePortNATMapMax = 1 }, "invalid --lb-nodeport-nat-map-max 1"},
	} {
		cfg := defaultConfig
		tc.edit(&cfg)
		if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want %q", cfg, err, tc.want)
		}
	}
	for _, mode := range []string{LBModeSNAT, LBModeDSR} {
		cfg := defaultConfig
		cfg.LBMode = mode
		if err := cfg.validate(); err != nil {
			t.Errorf("--lb-mode=%s: %v", mode, err)
		}
	}
	if got := (Config{LBMode: LBModeDSR}).lbModeConstant(); got != 1 {
		t.Errorf("lb_mode for dsr = %d, want 1 (LB_MODE_DSR)", got)
	}
	if got := (Config{LBMode: LBModeSNAT}).lbModeConstant(); got != 0 {
		t.Errorf("lb_mode for snat = %d, want 0 (LB_MODE_SNAT)", got)
	}
}

// TestDSRFallbacksMetric: the metric reads the loaded programs' counter,
// and 0 before they are loaded.
func TestDSRFallbacksMetric(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	d := newDSRFallbacks()
	c := newNodePortMetrics(d, newNodePortPasses()).Collectors[0]
	if got := testutil.ToFloat64(c); got != 0 {
		t.Fatalf("before loading: %v, want 0", got)
	}
	spec, err := bpf.LoadNodePort()
	if err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	v := coll.Variables[bpf.NodePortVarDsrFallbacks]
	d.v.Store(v)
	// What the programs' __sync_fetch_and_add would leave.
	if err := v.Set(uint64(3)); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c); got != 3 {
		t.Errorf("cellium_nodeport_dsr_fallbacks_total = %v, want 3", got)
	}
}
