package policymaps

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/monitor/monitortest"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// TestVerdictsCounted: the datapath's policy-verdict and policy-denied
// records, read from the real ring buffer by the monitor, are counted by
// direction, verdict and reason; other records are not.
func TestVerdictsCounted(t *testing.T) {
	var (
		counter *verdictCounter
		events  *ctmaps.Events
	)
	h := celltest.New(daemon.Cell, bpfmaps.Cell, ctmaps.Cell, monitor.Cell, Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Provide(loadbalancer.NewFrontendsTable, statedb.RWTable[*loadbalancer.Frontend].ToTable),
		cell.Provide(loadbalancer.NewServicesTable, statedb.RWTable[*loadbalancer.Service].ToTable),
		cell.Provide(policy.NewEntriesTable, policy.NewEnforcementTable, policy.NewPrefixesTable),
		cell.Invoke(func(c *verdictCounter, e *ctmaps.Events) { counter, events = c, e }),
	)
	dir := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(dir, "state"), filepath.Join(dir, "run"), "node-1"
	})
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = bpfmapstest.Root(t) })
	hive.AddConfigOverride(h, func(c *ctmaps.Config) { c.ConntrackTCPMax, c.ConntrackAnyMax = 1024, 1024 })
	celltest.Start(t, h)
	w, err := monitortest.NewRecordWriter(events.Ring.EBPF(), events.Lost.EBPF())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	boot := monitorapi.SystemBootClock()
	pkt := monitorapi.Flow{Src: netip.MustParseAddr("10.244.0.2"), Dst: netip.MustParseAddr("10.244.0.3"), Proto: 6,
		SrcPort: 40000, DstPort: 80, TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74}
	in, out := pkt, pkt
	in.Direction, out.Direction = monitorapi.DirectionIngress, monitorapi.DirectionEgress
	now := boot.Boot.Add(time.Second)
	for _, ev := range []monitorapi.Event{
		&monitorapi.PolicyVerdictEvent{Time: now, EndpointID: 12, Match: monitorapi.PolicyMatchL3L4, Flow: in},
		&monitorapi.PolicyVerdictEvent{Time: now, EndpointID: 12, Match: monitorapi.PolicyMatchL3L4, Flow: in},
		&monitorapi.PolicyVerdictEvent{Time: now, EndpointID: 11, Match: monitorapi.PolicyMatchAll, Flow: out},
		&monitorapi.DropEvent{Time: now, EndpointID: 11, Reason: monitorapi.DropPolicyDenied, Flow: out},
		&monitorapi.DropEvent{Time: now, EndpointID: 11, Reason: monitorapi.DropInvalidPacket, Flow: pkt},
		&monitorapi.TraceEvent{Time: now, EndpointID: 11, Point: monitorapi.TraceToStack, Flow: pkt},
	} {
		rec, err := monitorapi.Encode(ev, boot)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(rec, 1); err != nil {
			t.Fatal(err)
		}
	}
	want := map[[3]string]float64{
		{"ingress", "allowed", "l3-l4"}:       2,
		{"egress", "allowed", "all"}:          1,
		{"egress", "denied", "policy-denied"}: 1,
	}
	celltest.Eventually(t, "verdicts counted", func() (bool, string) {
		n := testutil.ToFloat64(counter.verdicts.WithLabelValues("egress", "denied", "policy-denied"))
		return n == 1, fmt.Sprint(n, " counted")
	})
	for labels, n := range want {
		if got := testutil.ToFloat64(counter.verdicts.WithLabelValues(labels[:]...)); got != n {
			t.Errorf("verdicts %v = %v, want %v", labels, got, n)
		}
	}
	if got := testutil.CollectAndCount(counter.verdicts); got != len(want) {
		t.Errorf("%d label sets counted, want %d (no other record counts)", got, len(want))
	}
}
