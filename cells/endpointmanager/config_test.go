package endpointmanager_test

import (
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/cells/kvstore"
)

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*endpointmanager.Config)
		want string
	}{
		{"mtu", func(c *endpointmanager.Config) { c.EndpointMTU = 576 }, "invalid --endpoint-mtu 576: want 1280 (the IPv6 minimum) to 65535"},
		{"crash step", func(c *endpointmanager.Config) { c.EndpointTestCrashAt = "halfway" }, `invalid --endpoint-test-crash-at "halfway": want one of ipam-allocated, veth-created, endpoint-persisted`},
		{"restore live report", func(c *endpointmanager.Config) { c.EndpointRestoreLiveReport = 0 }, "invalid --endpoint-restore-live-report 0s: want a positive duration"},
		{"cni conf dir", func(c *endpointmanager.Config) { c.CNIConfDir = "net.d" }, `invalid --cni-conf-dir "net.d": must be an absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := celltest.New(daemon.Cell, api.Cell, ipam.Cell, kvstore.Cell, identity.Cell, endpointmanager.Cell)
			hive.AddConfigOverride(h, func(c *daemon.Config) { c.StateDir, c.RunDir = t.TempDir(), t.TempDir() })
			hive.AddConfigOverride(h, tc.cfg)
			err := h.Populate(hivetest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("populate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
