package cells_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cilium/hive/hivetest"

	"github.com/cellium/cellium/cells"
)

// TestAgentGraph builds the whole agent graph: a missing provider, a cycle
// or a bad default fails here, not on a node.
func TestAgentGraph(t *testing.T) {
	h := cells.NewHive()
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatalf("populate the agent graph: %v", err)
	}
}

// TestAgentModules checks that `agent hive` shows every module the
// architecture names for the cells built so far.
func TestAgentModules(t *testing.T) {
	var buf bytes.Buffer
	if err := cells.NewHive().PrintObjects(&buf, hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"daemon", "statedb", "jobs", "health", "metrics", "api", "sysctl", "bpf-maps", "devices", "k8s-client", "loadbalancer",
		"ipam", "endpoint-manager", "lb-maps", "loader", "endpoint-maps", "kvstore", "identity", "ipcache", "masquerade", "policy", "policy-maps"} {
		if !strings.Contains(buf.String(), "Ⓜ️ "+id+" (") {
			t.Errorf("agent hive does not show module %q", id)
		}
	}
}
