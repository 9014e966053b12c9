package hubble

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/cilium/api/v1/observer"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/ctmaps"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/health"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/cells/monitor"
	"github.com/cellium/cellium/cells/monitor/monitortest"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/pkg/monitorapi"
	"github.com/cellium/cellium/pkg/policymap"
	"github.com/cellium/cellium/pkg/polltest"
)

// cellEnv is the hubble cell in a hive with the real datapath event ring
// buffer, the monitor reading it and tables the test fills; records go
// into the ring buffer from a BPF program, as the datapath writes them.
type cellEnv struct {
	t         testing.TB
	db        *statedb.DB
	endpoints statedb.RWTable[*endpointmanager.Endpoint]
	frontends statedb.RWTable[*loadbalancer.Frontend]
	nodes     statedb.RWTable[*nodes.Node]
	health    statedb.Table[*health.Status]
	hubble    *Hubble
	events    *ctmaps.Events
	writer    *monitortest.RecordWriter
	client    observer.ObserverClient
	conn      *grpc.ClientConn
	boot      monitorapi.BootClock
	stop      func()
}

type envOptions struct {
	config   func(*Config)
	ctmaps   func(*ctmaps.Config)
	runDir   string
	noClient bool
	// nodes are the nodes table's rows at start.
	nodes []*nodes.Node
	// extra cells of the hive.
	extra []cell.Cell
}

// Pods and services of the tests.
var (
	webPod = &endpointmanager.Endpoint{
		ID: 1, ContainerID: "container-web", IPv4: netip.MustParseAddr("10.244.0.5"), IPv6: netip.MustParseAddr("fd00::5"),
		HostIfName: "lxc-web", HostIfIndex: 7, PodNamespace: "default", PodName: "web-1",
		Labels: map[string]string{"app": "web"}, State: endpointmanager.Ready,
	}
	dbPod = &endpointmanager.Endpoint{
		ID: 2, ContainerID: "container-db", IPv4: netip.MustParseAddr("10.244.0.9"), IPv6: netip.MustParseAddr("fd00::9"),
		HostIfName: "lxc-db", HostIfIndex: 8, PodNamespace: "db", PodName: "postgres-0",
		Labels: map[string]string{"app": "postgres"}, State: endpointmanager.Ready,
	}
	postgresFrontend = &loadbalancer.Frontend{
		Address:     loadbalancer.L3n4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 5432, Protocol: loadbalancer.TCP},
		Type:        loadbalancer.FrontendClusterIP,
		ServiceName: loadbalancer.ServiceName{Namespace: "db", Name: "postgres"},
	}
	dnsFrontend = &loadbalancer.Frontend{
		Address:     loadbalancer.L3n4Addr{Addr: netip.MustParseAddr("10.96.0.53"), Port: 53, Protocol: loadbalancer.UDP},
		Type:        loadbalancer.FrontendClusterIP,
		ServiceName: loadbalancer.ServiceName{Namespace: "kube-system", Name: "kube-dns"},
	}
)

// newTestHive is the hubble cell in a hive with the cells it needs, empty
// endpoints and frontends tables, and extra.
func newTestHive(extra ...cell.Cell) *hive.Hive {
	return celltest.New(append([]cell.Cell{daemon.Cell, bpfmaps.Cell, ctmaps.Cell, monitor.Cell, Cell,
		cell.Provide(endpointmanager.NewTable, statedb.RWTable[*endpointmanager.Endpoint].ToTable),
		cell.Provide(loadbalancer.NewFrontendsTable, statedb.RWTable[*loadbalancer.Frontend].ToTable),
		cell.Provide(loadbalancer.NewServicesTable, statedb.RWTable[*loadbalancer.Service].ToTable),
		cell.Provide(ipcache.NewTable, statedb.RWTable[*ipcache.Entry].ToTable),
		cell.Provide(idalloc.NewTable, statedb.RWTable[*idalloc.Identity].ToTable),
		cell.Provide(nodes.NewTable, statedb.RWTable[*nodes.Node].ToTable),
	}, extra...)...)
}

func newCellEnv(t testing.TB, opts envOptions) *cellEnv {
	t.Helper()
	root := bpfmapstest.Root(t)
	e := &cellEnv{t: t, boot: monitorapi.SystemBootClock()}
	h := newTestHive(append(opts.extra,
		cell.Invoke(func(db *statedb.DB, eps statedb.RWTable[*endpointmanager.Endpoint], fes statedb.RWTable[*loadbalancer.Frontend],
			hs statedb.Table[*health.Status], hb *Hubble, events *ctmaps.Events, ns statedb.RWTable[*nodes.Node]) {
			e.db, e.endpoints, e.frontends, e.health, e.hubble, e.events, e.nodes = db, eps, fes, hs, hb, events, ns
			txn := db.WriteTxn(eps, fes, ns)
			for _, n := range opts.nodes {
				ns.Insert(txn, n)
			}
			eps.Insert(txn, webPod)
			eps.Insert(txn, dbPod)
			fes.Insert(txn, postgresFrontend)
			fes.Insert(txn, dnsFrontend)
			txn.Commit()
		}))...,
	)
	runDir := opts.runDir
	if runDir == "" {
		runDir = filepath.Join(t.TempDir(), "run")
	}
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir = filepath.Join(filepath.Dir(runDir), "state")
		c.RunDir = runDir
		c.NodeName = "node-1"
	})
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *ctmaps.Config) {
		// The conntrack maps are not used here: keep them small.
		c.ConntrackTCPMax, c.ConntrackAnyMax = 1024, 1024
		if opts.ctmaps != nil {
			opts.ctmaps(c)
		}
	})
	if opts.config != nil {
		hive.AddConfigOverride(h, opts.config)
	}
	celltest.Start(t, h)
	e.stop = func() {
		// Stopping a stopped hive does nothing, so the stop at the test's
		// end may follow this one.
		if err := h.Stop(hivetest.Logger(t), context.Background()); err != nil {
			t.Errorf("stop hive: %v", err)
		}
	}

	w, err := monitortest.NewRecordWriter(e.events.Ring.EBPF(), e.events.Lost.EBPF())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	e.writer = w
	if !opts.noClient {
		e.conn, err = Dial(e.hubble.Address())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.conn.Close() })
		e.client = observer.NewObserverClient(e.conn)
	}
	return e
}

// write puts the records of evs into the ring buffer.
func (e *cellEnv) write(evs ...monitorapi.Event) {
	e.t.Helper()
	for _, ev := range evs {
		rec, err := monitorapi.Encode(ev, e.boot)
		if err != nil {
			e.t.Fatal(err)
		}
		if err := e.writer.Write(rec, 1); err != nil {
			e.t.Fatal(err)
		}
	}
}

// follow opens a following GetFlows stream and returns once the server
// follows the ring: every flow added afterwards reaches it.
func (e *cellEnv) follow(ctx context.Context, req *observer.GetFlowsRequest) observer.Observer_GetFlowsClient {
	e.t.Helper()
	req.Follow = true
	stream, err := e.client.GetFlows(ctx, req)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		e.t.Fatal(err)
	}
	return stream
}

// writeAndWait writes evs and returns their flows once a following stream
// received them all.
func (e *cellEnv) writeAndWait(evs ...monitorapi.Event) []*flow.Flow {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := e.follow(ctx, &observer.GetFlowsRequest{})
	e.write(evs...)
	var (
		flows []*flow.Flow
		lost  uint64
	)
	for uint64(len(flows))+lost < uint64(len(evs)) {
		resp, err := stream.Recv()
		if err != nil {
			e.t.Fatalf("after %d of %d flows: %v", len(flows), len(evs), err)
		}
		// A ring smaller than the records overwrites some before the
		// stream reads them.
		if l := resp.GetLostEvents(); l != nil {
			if l.GetSource() != flow.LostEventSource_HUBBLE_RING_BUFFER {
				e.t.Fatalf("lost events: %v", l)
			}
			lost += l.GetNumEventsLost()
			continue
		}
		flows = append(flows, resp.GetFlow())
	}
	return flows
}

// The records of the tests, a second apart from base.
func testEvents(base time.Time) []monitorapi.Event {
	at := func(i int) time.Time { return base.Add(time.Duration(i) * time.Second) }
	web4, db4 := webPod.IPv4, dbPod.IPv4
	return []monitorapi.Event{
		// 0: web-1 opens a connection to postgres-0: its SYN leaves web-1...
		&monitorapi.TraceEvent{Time: at(0), EndpointID: 1, IfIndex: 7, Point: monitorapi.TraceFromEndpoint, Flow: monitorapi.Flow{
			Src: web4, Dst: db4, Proto: 6, SrcPort: 40000, DstPort: 5432, TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74}},
		// 1: ... and enters postgres-0,
		&monitorapi.TraceEvent{Time: at(1), EndpointID: 2, IfIndex: 8, Point: monitorapi.TraceToEndpoint, Flow: monitorapi.Flow{
			Src: web4, Dst: db4, Proto: 6, SrcPort: 40000, DstPort: 5432, TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74}},
		// 2: whose SYN-ACK leaves it, a reply.
		&monitorapi.TraceEvent{Time: at(2), EndpointID: 2, IfIndex: 8, Point: monitorapi.TraceFromEndpoint, Flow: monitorapi.Flow{
			Src: db4, Dst: web4, Proto: 6, SrcPort: 5432, DstPort: 40000, TCPFlags: monitorapi.TCPSyn | monitorapi.TCPAck, CTState: monitorapi.CTReply, Len: 74}},
		// 3: a DNS query of web-1 to kube-dns is dropped.
		&monitorapi.DropEvent{Time: at(3), EndpointID: 1, IfIndex: 7, Reason: monitorapi.DropCTCreateFailed, Flow: monitorapi.Flow{
			Src: web4, Dst: dnsFrontend.Address.Addr, Proto: 17, SrcPort: 33000, DstPort: 53, Len: 80}},
		// 4: web-1 pings an address off the node.
		&monitorapi.TraceEvent{Time: at(4), EndpointID: 1, IfIndex: 7, Point: monitorapi.TraceToStack, Flow: monitorapi.Flow{
			Src: web4, Dst: netip.MustParseAddr("192.0.2.1"), Proto: 1, SrcPort: 77, ICMPType: 8, CTState: monitorapi.CTNew, Len: 98}},
		// 5: a socket connects to the postgres service and is sent to
		// postgres-0.
		&monitorapi.SockLBEvent{Time: at(5), Hook: monitorapi.SockLBConnect, Proto: 6, RevNATIndex: 3, SockCookie: 99, NetnsCookie: 4096,
			Original:   netip.AddrPortFrom(postgresFrontend.Address.Addr, 5432),
			Translated: netip.AddrPortFrom(db4, 5432)},
		// 6: a DNS query over IPv6 enters postgres-0.
		&monitorapi.TraceEvent{Time: at(6), EndpointID: 2, IfIndex: 8, Point: monitorapi.TraceToEndpoint, Flow: monitorapi.Flow{
			Src: webPod.IPv6, Dst: dbPod.IPv6, Proto: 17, SrcPort: 5353, DstPort: 53, CTState: monitorapi.CTNew, Len: 90}},
	}
}

// The flows of testEvents, without their times.
func wantFlows() []*flow.Flow {
	web := &flow.Endpoint{ID: 1, Namespace: "default", PodName: "web-1", Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"}}
	db := &flow.Endpoint{ID: 2, Namespace: "db", PodName: "postgres-0", Labels: []string{"k8s:app=postgres", "k8s:io.kubernetes.pod.namespace=db"}}
	tcp := func(sport, dport uint32, flags *flow.TCPFlags) *flow.Layer4 {
		return &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: sport, DestinationPort: dport, Flags: flags}}}
	}
	udp := func(sport, dport uint32) *flow.Layer4 {
		return &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: sport, DestinationPort: dport}}}
	}
	ip4 := func(src, dst string) *flow.IP {
		return &flow.IP{Source: src, Destination: dst, IpVersion: flow.IPVersion_IPv4}
	}
	webIf := &flow.NetworkInterface{Index: 7, Name: "lxc-web"}
	dbIf := &flow.NetworkInterface{Index: 8, Name: "lxc-db"}
	return []*flow.Flow{
		{
			Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
			IP: ip4("10.244.0.5", "10.244.0.9"), L4: tcp(40000, 5432, &flow.TCPFlags{SYN: true}),
			Source: web, Destination: db,
			EventType:             &flow.CiliumEventType{Type: 4, SubType: 5},
			TraceObservationPoint: flow.TraceObservationPoint_FROM_ENDPOINT, TraceReason: flow.TraceReason_NEW,
			IsReply: wrapperspb.Bool(false), TrafficDirection: flow.TrafficDirection_EGRESS,
			Interface: webIf, Summary: "TCP Flags: SYN",
		},
		{
			Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
			IP: ip4("10.244.0.5", "10.244.0.9"), L4: tcp(40000, 5432, &flow.TCPFlags{SYN: true}),
			Source: web, Destination: db,
			EventType:             &flow.CiliumEventType{Type: 4, SubType: 0},
			TraceObservationPoint: flow.TraceObservationPoint_TO_ENDPOINT, TraceReason: flow.TraceReason_NEW,
			IsReply: wrapperspb.Bool(false), TrafficDirection: flow.TrafficDirection_INGRESS,
			Interface: dbIf, Summary: "TCP Flags: SYN",
		},
		{
			Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
			IP: ip4("10.244.0.9", "10.244.0.5"), L4: tcp(5432, 40000, &flow.TCPFlags{SYN: true, ACK: true}),
			Source: db, Destination: web,
			EventType:             &flow.CiliumEventType{Type: 4, SubType: 5},
			TraceObservationPoint: flow.TraceObservationPoint_FROM_ENDPOINT, TraceReason: flow.TraceReason_REPLY,
			// A reply leaving postgres-0 belongs to a connection into it.
			IsReply: wrapperspb.Bool(true), TrafficDirection: flow.TrafficDirection_INGRESS,
			Interface: dbIf, Summary: "TCP Flags: SYN, ACK",
		},
		{
			Verdict: flow.Verdict_DROPPED, DropReasonDesc: flow.DropReason_CT_MAP_INSERTION_FAILED, DropReason: 155,
			Type: flow.FlowType_L3_L4, NodeName: "node-1",
			IP: ip4("10.244.0.5", "10.96.0.53"), L4: udp(33000, 53),
			Source:             web,
			DestinationService: &flow.Service{Namespace: "kube-system", Name: "kube-dns"},
			EventType:          &flow.CiliumEventType{Type: 1, SubType: 155},
			TrafficDirection:   flow.TrafficDirection_EGRESS,
			Interface:          webIf, Summary: "UDP",
		},
		{
			Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
			IP:     ip4("10.244.0.5", "192.0.2.1"),
			L4:     &flow.Layer4{Protocol: &flow.Layer4_ICMPv4{ICMPv4: &flow.ICMPv4{Type: 8}}},
			Source: web,
			// to-stack is Cilium's trace sub-type 3.
			EventType:             &flow.CiliumEventType{Type: 4, SubType: 3},
			TraceObservationPoint: flow.TraceObservationPoint_TO_STACK, TraceReason: flow.TraceReason_NEW,
			IsReply: wrapperspb.Bool(false), TrafficDirection: flow.TrafficDirection_EGRESS,
			Interface: webIf, Summary: "ICMPv4 EchoRequest",
		},
		{
			Verdict: flow.Verdict_TRANSLATED, Type: flow.FlowType_SOCK, NodeName: "node-1",
			IP:                 &flow.IP{Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
			L4:                 tcp(0, 5432, nil),
			Destination:        db,
			DestinationService: &flow.Service{Namespace: "db", Name: "postgres"},
			EventType:          &flow.CiliumEventType{Type: 7, SubType: 2},
			SockXlatePoint:     flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_FWD,
			SocketCookie:       99,
			Summary:            "TCP connect 10.96.0.10:5432 -> 10.244.0.9:5432 (service db/postgres)",
		},
		{
			Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
			IP: &flow.IP{Source: "fd00::5", Destination: "fd00::9", IpVersion: flow.IPVersion_IPv6}, L4: udp(5353, 53),
			Source: web, Destination: db,
			EventType:             &flow.CiliumEventType{Type: 4, SubType: 0},
			TraceObservationPoint: flow.TraceObservationPoint_TO_ENDPOINT, TraceReason: flow.TraceReason_NEW,
			IsReply: wrapperspb.Bool(false), TrafficDirection: flow.TrafficDirection_INGRESS,
			Interface: dbIf, Summary: "UDP",
		},
	}
}

// testBase is a time a minute ago, and after boot: the records' times are
// nanoseconds since boot.
func testBase(boot monitorapi.BootClock) time.Time {
	base := time.Now().Add(-time.Minute).Truncate(time.Second)
	if base.Before(boot.Boot) {
		base = boot.Boot.Add(time.Second).Truncate(time.Second).Add(time.Second)
	}
	return base
}

func TestFlowsFromDatapathRecords(t *testing.T) {
	e := newCellEnv(t, envOptions{})
	base := testBase(e.boot)
	got := e.writeAndWait(testEvents(base)...)
	want := wantFlows()
	if len(got) != len(want) {
		t.Fatalf("%d flows, want %d", len(got), len(want))
	}
	for i, f := range got {
		// Times go through the boot clock: nanoseconds since boot.
		if d := f.GetTime().AsTime().Sub(base.Add(time.Duration(i) * time.Second)); d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("flow %d at %v, want %v", i, f.GetTime().AsTime(), base.Add(time.Duration(i)*time.Second))
		}
		f = proto.Clone(f).(*flow.Flow)
		f.Time = nil
		if !proto.Equal(f, want[i]) {
			t.Errorf("flow %d:\n got %v\nwant %v", i, f, want[i])
		}
	}
}

// flowIndex names a flow of testEvents by its second after base.
func flowIndex(base time.Time, resp *observer.GetFlowsResponse) string {
	if l := resp.GetLostEvents(); l != nil {
		return fmt.Sprintf("lost:%d", l.GetNumEventsLost())
	}
	return fmt.Sprint(int(resp.GetFlow().GetTime().AsTime().Sub(base).Round(time.Second) / time.Second))
}

func TestGetFlowsFromTheCell(t *testing.T) {
	e := newCellEnv(t, envOptions{})
	base := testBase(e.boot)
	e.writeAndWait(testEvents(base)...)
	// Half a second off the flows' times, which the boot clock may move by
	// a few nanoseconds.
	ts := func(sec float64) *timestamppb.Timestamp {
		return timestamppb.New(base.Add(time.Duration(sec * float64(time.Second))))
	}

	tests := []struct {
		name string
		req  *observer.GetFlowsRequest
		want string
	}{
		{"all", &observer.GetFlowsRequest{}, "0 1 2 3 4 5 6"},
		{"last 2", &observer.GetFlowsRequest{Number: 2}, "5 6"},
		{"first 2", &observer.GetFlowsRequest{Number: 2, First: true}, "0 1"},
		{"since and until", &observer.GetFlowsRequest{Since: ts(1.5), Until: ts(4.5)}, "2 3 4"},
		{"last 1 until", &observer.GetFlowsRequest{Number: 1, Until: ts(3.5)}, "3"},
		{"first 1 since", &observer.GetFlowsRequest{Number: 1, First: true, Since: ts(5.5)}, "6"},
		{"source IP", allow(&flow.FlowFilter{SourceIp: []string{"10.244.0.9"}}), "2"},
		{"destination CIDR", allow(&flow.FlowFilter{DestinationIp: []string{"fd00::/64"}}), "6"},
		{"not from an IP", deny(&flow.FlowFilter{SourceIp: []string{"10.244.0.5", "fd00::5"}}), "2 5"},
		{"source pod", allow(&flow.FlowFilter{SourcePod: []string{"db/postgres"}}), "2"},
		{"destination pod in a namespace", allow(&flow.FlowFilter{DestinationPod: []string{"db/"}}), "0 1 5 6"},
		{"not to a namespace", deny(&flow.FlowFilter{DestinationPod: []string{"db/"}}), "2 3 4"},
		// What `--namespace default` sends: either side in it.
		{"namespace", allow(&flow.FlowFilter{SourcePod: []string{"default/"}}, &flow.FlowFilter{DestinationPod: []string{"default/"}}), "0 1 2 3 4 6"},
		{"verdict", allow(&flow.FlowFilter{Verdict: []flow.Verdict{flow.Verdict_DROPPED}}), "3"},
		{"not forwarded", deny(&flow.FlowFilter{Verdict: []flow.Verdict{flow.Verdict_FORWARDED}}), "3 5"},
		{"protocol", allow(&flow.FlowFilter{Protocol: []string{"udp"}}), "3 6"},
		{"icmp", allow(&flow.FlowFilter{Protocol: []string{"icmp"}}), "4"},
		{"not tcp", deny(&flow.FlowFilter{Protocol: []string{"tcp"}}), "3 4 6"},
		{"destination port", allow(&flow.FlowFilter{DestinationPort: []string{"5432"}}), "0 1 5"},
		{"source port", allow(&flow.FlowFilter{SourcePort: []string{"5432"}}), "2"},
		{"not to port 53", deny(&flow.FlowFilter{DestinationPort: []string{"53"}}), "0 1 2 4 5"},
		{"destination service", allow(&flow.FlowFilter{DestinationService: []string{"db/postgres"}}), "5"},
		{"source label", allow(&flow.FlowFilter{SourceLabel: []string{"k8s:app=web"}}), "0 1 3 4 6"},
		{"allow and deny", &observer.GetFlowsRequest{
			Whitelist: []*flow.FlowFilter{{DestinationPod: []string{"db/postgres"}}},
			Blacklist: []*flow.FlowFilter{{Protocol: []string{"udp"}}},
		}, "0 1 5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stream, err := e.client.GetFlows(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			resps, err := recvAll(stream)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, resp := range resps {
				got = append(got, flowIndex(base, resp))
			}
			if strings.Join(got, " ") != tc.want {
				t.Fatalf("flows %v, want %s", got, tc.want)
			}
		})
	}
}

func allow(ff ...*flow.FlowFilter) *observer.GetFlowsRequest {
	return &observer.GetFlowsRequest{Whitelist: ff}
}

func deny(ff ...*flow.FlowFilter) *observer.GetFlowsRequest {
	return &observer.GetFlowsRequest{Blacklist: ff}
}

func TestFollowFromTheCell(t *testing.T) {
	e := newCellEnv(t, envOptions{})
	base := testBase(e.boot)
	evs := testEvents(base)
	e.writeAndWait(evs[:2]...)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The last flow held, then new ones that pass the filter.
	stream := e.follow(ctx, &observer.GetFlowsRequest{
		Number:    1,
		Whitelist: []*flow.FlowFilter{{SourcePod: []string{"default/web"}}},
	})
	e.write(evs[2:]...)
	recv := func(n int) []string {
		t.Helper()
		var got []string
		for len(got) < n {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("after %v: %v", got, err)
			}
			got = append(got, flowIndex(base, resp))
		}
		return got
	}
	// Flow 2 is from postgres-0 and 5 has no source: filtered out.
	if got, want := strings.Join(recv(4), " "), "1 3 4 6"; got != want {
		t.Fatalf("followed %s, want %s", got, want)
	}
	// And it keeps following.
	later := *evs[0].(*monitorapi.TraceEvent)
	later.Time = base.Add(7 * time.Second)
	e.write(&later)
	if got := recv(1); got[0] != "7" {
		t.Fatalf("followed %v, want the flow at second 7", got)
	}
}

func TestServerStatusAndHealthOfTheCell(t *testing.T) {
	e := newCellEnv(t, envOptions{config: func(c *Config) {
		c.HubbleBufferSize = 5
		// The queue takes all seven: what the ring drops is the test.
		c.HubbleEventQueueSize = 64
	}})
	// Seven flows into five slots, stamped now: all within the rate's
	// window.
	now := time.Now()
	evs := testEvents(now)
	for i := range evs {
		switch ev := evs[i].(type) {
		case *monitorapi.TraceEvent:
			ev.Time = now
		case *monitorapi.DropEvent:
			ev.Time = now
		case *monitorapi.SockLBEvent:
			ev.Time = now
		}
	}
	e.writeAndWait(evs...)

	st, err := e.client.ServerStatus(context.Background(), &observer.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.NumFlows != 5 || st.MaxFlows != 5 || st.SeenFlows != 7 || st.UptimeNs == 0 {
		t.Fatalf("status %v, want 5 of 5 flows held, 7 seen, some uptime", st)
	}
	// The ring dropped two of the window's flows: the rate is over the
	// five it holds, from the oldest to now, which is about zero seconds.
	if st.FlowsRate <= 0 {
		t.Fatalf("flows rate %v, want the rate of the flows held", st.FlowsRate)
	}

	for _, service := range []string{ObserverService, HubbleService} {
		resp, err := healthpb.NewHealthClient(e.conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check of %s = %v, %v; want SERVING", service, resp, err)
		}
	}
	s, _, found := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("hubble"))
	if !found || s.Level != cell.StatusOK || s.Message != "Serving on "+e.hubble.Address().String() {
		t.Fatalf("module health %+v, want OK, serving on %s", s, e.hubble.Address())
	}
	if a := e.hubble.Address(); a.Network != "unix" || filepath.Base(a.Addr) != SocketName {
		t.Fatalf("address %v, want hubble.sock in the run directory", a)
	}

	// Stopping removes the socket and reports it.
	e.stop()
	if _, err := os.Lstat(e.hubble.Address().Addr); !os.IsNotExist(err) {
		t.Fatalf("socket after stop: %v, want it removed", err)
	}
	s, _, _ = e.health.Get(e.db.ReadTxn(), health.StatusID.Query("hubble"))
	if s.Level != cell.StatusStopped {
		t.Fatalf("module health after stop %+v, want Stopped", s)
	}
}

// The rate with all flows held: the count over the agent's uptime, which
// is shorter than a minute.
func TestFlowsRateOfTheCell(t *testing.T) {
	e := newCellEnv(t, envOptions{})
	now := time.Now()
	ev := testEvents(now)[0].(*monitorapi.TraceEvent)
	ev.Time = now
	e.writeAndWait(ev, ev, ev)
	st, err := e.client.ServerStatus(context.Background(), &observer.ServerStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := 3 / (float64(st.UptimeNs) / 1e9)
	if st.NumFlows != 3 || st.SeenFlows != 3 || st.MaxFlows != 4095 || math.Abs(st.FlowsRate-want) > want*1e-9 {
		t.Fatalf("status %v, want 3 flows of the default 4095, at 3 per %v = %v/s", st, time.Duration(st.UptimeNs), want)
	}
}

func TestServesOnTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	e := newCellEnv(t, envOptions{config: func(c *Config) { c.HubbleListenAddress, c.HubbleDisableTLS = addr, true }})
	if a := e.hubble.Address(); a.Network != "tcp" || a.Addr != addr {
		t.Fatalf("address %v, want tcp %s", a, addr)
	}
	flows := e.writeAndWait(testEvents(testBase(e.boot))[0])
	if flows[0].GetSource().GetPodName() != "web-1" {
		t.Fatalf("flow over TCP %v, want web-1's", flows[0])
	}
}

func TestDisabled(t *testing.T) {
	runDir := filepath.Join(t.TempDir(), "run")
	e := newCellEnv(t, envOptions{runDir: runDir, noClient: true, config: func(c *Config) { c.HubbleEnabled = false }})
	if _, err := os.Lstat(filepath.Join(runDir, SocketName)); !os.IsNotExist(err) {
		t.Fatalf("socket of a disabled server: %v, want none", err)
	}
	s, _, found := e.health.Get(e.db.ReadTxn(), health.StatusID.Query("hubble"))
	if !found || s.Level != cell.StatusOK || !strings.Contains(s.Message, "Disabled") {
		t.Fatalf("module health %+v, want OK, disabled", s)
	}
}

func TestStartFailsOnAPathThatIsNoSocket(t *testing.T) {
	root := bpfmapstest.Root(t)
	file := filepath.Join(t.TempDir(), "not-a-socket")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h := newTestHive()
	dir := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir = filepath.Join(dir, "state"), filepath.Join(dir, "run")
	})
	hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root })
	hive.AddConfigOverride(h, func(c *Config) { c.HubbleListenAddress = "unix://" + file })
	log := hivetest.Logger(t)
	err := h.Start(log, context.Background())
	defer h.Stop(log, context.Background())
	if err == nil || !strings.Contains(err.Error(), "--hubble-listen-address "+file+" exists and is not a socket") {
		t.Fatalf("start = %v, want an error naming the flag and the path", err)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{HubbleBufferSize: 0}, "invalid --hubble-buffer-size 0: want 1 to 1048576 flows"},
		{Config{HubbleBufferSize: 1 << 21}, "invalid --hubble-buffer-size 2097152"},
		{Config{HubbleBufferSize: 1, HubbleEventQueueSize: -1}, "invalid --hubble-event-queue-size -1"},
	} {
		if err := tc.cfg.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if err := DefaultConfig.validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
}

// Events lost on the way are accounted for: what the datapath could not
// write into the ring buffer and what the cell's queue could not take
// become lost-event records, and with the flows they add up to what was
// written.
func TestLostEventsOfTheCell(t *testing.T) {
	const written = 20000
	e := newCellEnv(t, envOptions{
		// A page of ring buffer holds 56 records: the program writes far
		// faster than the monitor reads.
		ctmaps: func(c *ctmaps.Config) { c.MonitorRingbufSize = uint32(os.Getpagesize()) },
		config: func(c *Config) {
			c.HubbleBufferSize = 1 << 15
			c.HubbleEventQueueSize = 16
		},
	})
	rec, err := monitorapi.Encode(testEvents(testBase(e.boot))[0], e.boot)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.writer.Write(rec, written); err != nil {
		t.Fatal(err)
	}
	datapathLost, err := e.events.LostEvents()
	if err != nil {
		t.Fatal(err)
	}
	if datapathLost == 0 {
		t.Fatalf("the datapath lost none of %d records in a page of ring buffer", written)
	}

	// The datapath's losses are reported within a second; poll for them.
	var last string
	polltest.Until(t, "flows and lost events adding up to what was written", 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		var flows, queue, datapath uint64
		stream, err := e.client.GetFlows(context.Background(), &observer.GetFlowsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		resps, err := recvAll(stream)
		if err != nil {
			t.Fatal(err)
		}
		for _, resp := range resps {
			switch l := resp.GetLostEvents(); l.GetSource() {
			case flow.LostEventSource_PERF_EVENT_RING_BUFFER:
				datapath += l.GetNumEventsLost()
			case flow.LostEventSource_OBSERVER_EVENTS_QUEUE:
				queue += l.GetNumEventsLost()
			default:
				flows++
			}
		}
		// The queue also carries the monitor's notification that the agent
		// started: it is either among the agent events or lost.
		agentEvents := countAgentEvents(t, e.client)
		last = fmt.Sprintf("%d flows, %d lost in the datapath (counter: %d), %d in the queue, %d agent events; want them to add up to %d and the agent's start",
			flows, datapath, datapathLost, queue, agentEvents, written)
		return datapath == datapathLost && flows+queue+datapath == written+1-agentEvents, last
	})
	t.Log(last)
}

func countAgentEvents(t *testing.T, c observer.ObserverClient) uint64 {
	t.Helper()
	stream, err := c.GetAgentEvents(context.Background(), &observer.GetAgentEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resps, err := recvAll(stream)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(len(resps))
}

func TestAgentEventsOfTheCell(t *testing.T) {
	e := newCellEnv(t, envOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The monitor says the agent started once every cell has, from a job:
	// it may come before or after the stream begins.
	stream, err := e.client.GetAgentEvents(ctx, &observer.GetAgentEventsRequest{Follow: true, Number: 10})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	ev := resp.GetAgentEvent()
	if ev.GetType() != flow.AgentEventType_AGENT_STARTED || ev.GetAgentStart().GetTime() == nil || resp.GetNodeName() != "node-1" {
		t.Fatalf("first agent event %v of node %q, want the agent's start, with its time, on node-1", ev, resp.GetNodeName())
	}

	// Flows of a pod that came after the start are enriched with it.
	pod := webPod.Clone()
	pod.ID, pod.ContainerID, pod.PodName = 3, "container-web-2", "web-2"
	pod.IPv4, pod.IPv6 = netip.MustParseAddr("10.244.0.6"), netip.Addr{}
	txn := e.db.WriteTxn(e.endpoints)
	e.endpoints.Insert(txn, pod)
	txn.Commit()
	trace := *testEvents(testBase(e.boot))[4].(*monitorapi.TraceEvent)
	trace.Flow.Src = pod.IPv4
	if f := e.writeAndWait(&trace)[0]; f.GetSource().GetPodName() != "web-2" || f.GetSource().GetID() != 3 {
		t.Fatalf("flow from the new pod %v, want source web-2 (ID 3)", f)
	}
}

// TestPolicyVerdictAllowedBy: a policy verdict's cookie becomes, through
// the policy-entries table, the NetworkPolicies that allowed the
// connection, in ingress_allowed_by or egress_allowed_by by its direction,
// as GetFlows serves them; a cookie no entry has names none.
func TestPolicyVerdictAllowedBy(t *testing.T) {
	var (
		db      *statedb.DB
		entries statedb.RWTable[*policy.Entry]
	)
	e := newCellEnv(t, envOptions{extra: []cell.Cell{
		cell.Provide(policy.NewEntriesTable, statedb.RWTable[*policy.Entry].ToTable),
		cell.Invoke(func(d *statedb.DB, t statedb.RWTable[*policy.Entry]) { db, entries = d, t }),
	}})
	ingress := []string{"db/allow-web"}
	egress := []string{"default/web-egress", "default/web-more"}
	txn := db.WriteTxn(entries)
	entries.Insert(txn, &policy.Entry{Key: policy.EntryKey{EndpointID: 2, Direction: policy.Ingress, Identity: 1001, Protocol: 6, Port: 5432},
		Policies: ingress})
	entries.Insert(txn, &policy.Entry{Key: policy.EntryKey{EndpointID: 1, Direction: policy.Egress, Protocol: 6, Port: 5432},
		Policies: egress})
	txn.Commit()

	base := testBase(e.boot)
	pkt := monitorapi.Flow{Src: webPod.IPv4, Dst: dbPod.IPv4, Proto: 6, SrcPort: 40000, DstPort: 5432,
		TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74}
	in, out, unknown := pkt, pkt, pkt
	in.Direction, in.PolicyCookie = monitorapi.DirectionIngress, policymap.Cookie(ingress)
	out.Direction, out.PolicyCookie = monitorapi.DirectionEgress, policymap.Cookie(egress)
	unknown.Direction, unknown.PolicyCookie = monitorapi.DirectionIngress, 12345
	flows := e.writeAndWait(
		&monitorapi.PolicyVerdictEvent{Time: base, EndpointID: 2, IfIndex: 8, Match: monitorapi.PolicyMatchL3L4, Flow: in},
		&monitorapi.PolicyVerdictEvent{Time: base, EndpointID: 1, IfIndex: 7, Match: monitorapi.PolicyMatchL4Only, Flow: out},
		&monitorapi.PolicyVerdictEvent{Time: base, EndpointID: 2, IfIndex: 8, Match: monitorapi.PolicyMatchL3L4, Flow: unknown},
	)
	policyPB := func(ns, name string) *flow.Policy {
		return &flow.Policy{Name: name, Namespace: ns, Kind: "NetworkPolicy", Labels: []string{
			"k8s:io.cilium.k8s.policy.derived-from=NetworkPolicy",
			"k8s:io.cilium.k8s.policy.name=" + name, "k8s:io.cilium.k8s.policy.namespace=" + ns}}
	}
	for i, want := range []struct{ in, out []*flow.Policy }{
		{in: []*flow.Policy{policyPB("db", "allow-web")}},
		{out: []*flow.Policy{policyPB("default", "web-egress"), policyPB("default", "web-more")}},
		{},
	} {
		f := flows[i]
		gotIn, gotOut := &flow.Flow{IngressAllowedBy: f.GetIngressAllowedBy()}, &flow.Flow{EgressAllowedBy: f.GetEgressAllowedBy()}
		if !proto.Equal(gotIn, &flow.Flow{IngressAllowedBy: want.in}) || !proto.Equal(gotOut, &flow.Flow{EgressAllowedBy: want.out}) {
			t.Errorf("flow %d: ingress_allowed_by %v egress_allowed_by %v, want %v and %v", i, f.GetIngressAllowedBy(), f.GetEgressAllowedBy(), want.in, want.out)
		}
		if f.GetVerdict() != flow.Verdict_FORWARDED {
			t.Errorf("flow %d: verdict %v, want FORWARDED", i, f.GetVerdict())
		}
	}
}
