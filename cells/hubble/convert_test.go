package hubble

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/cells/endpointmanager"
	idalloc "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/ipcache"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/labels"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// newTestConverter is a converter over tables holding the test pods and
// services, without the kernel.
func newTestConverter(t *testing.T) (*converter, *statedb.DB) {
	t.Helper()
	db := statedb.New()
	eps, err := endpointmanager.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	fes, err := loadbalancer.NewFrontendsTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ipc, err := ipcache.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := idalloc.NewTable(db)
	if err != nil {
		t.Fatal(err)
	}
	txn := db.WriteTxn(eps, fes)
	eps.Insert(txn, webPod)
	eps.Insert(txn, dbPod)
	fes.Insert(txn, postgresFrontend)
	fes.Insert(txn, dnsFrontend)
	txn.Commit()
	return newConverter("node-1", Tables{Endpoints: eps, Frontends: fes, IPCache: ipc, Identities: ids}), db
}

func TestSockFlowReverse(t *testing.T) {
	c, db := newTestConverter(t)
	// recvmsg: a reply from postgres-0 is shown to the application as
	// coming from the service.
	ev := &monitorapi.SockLBEvent{Time: epoch, Hook: monitorapi.SockLBRecvmsg, Proto: 17, SockCookie: 5,
		Original:   netip.AddrPortFrom(dbPod.IPv4, 53),
		Translated: netip.AddrPortFrom(dnsFrontend.Address.Addr, 53)}
	want := &flow.Flow{
		Time: timestamppb.New(epoch), Verdict: flow.Verdict_TRANSLATED, Type: flow.FlowType_SOCK, NodeName: "node-1",
		IP:             &flow.IP{Source: "10.96.0.53", IpVersion: flow.IPVersion_IPv4},
		L4:             &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: 53}}},
		SourceService:  &flow.Service{Namespace: "kube-system", Name: "kube-dns"},
		EventType:      &flow.CiliumEventType{Type: 7, SubType: 4},
		SockXlatePoint: flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_REV,
		SocketCookie:   5,
		Summary:        "UDP recvmsg 10.244.0.9:53 -> 10.96.0.53:53 (service kube-system/kube-dns)",
	}
	if got := c.flowOf(db.ReadTxn(), ev); !proto.Equal(got, want) {
		t.Fatalf("flow\n got %v\nwant %v", got, want)
	}
}

func TestPacketFlowEdges(t *testing.T) {
	c, db := newTestConverter(t)
	tests := []struct {
		name string
		ev   monitorapi.Event
		want *flow.Flow
	}{
		{
			// Dropped before its addresses were read: no IP layer, no
			// endpoints, a reason this agent has a name for only.
			name: "drop without addresses, reason Hubble does not know",
			ev:   &monitorapi.DropEvent{Time: epoch, EndpointID: 1, IfIndex: 9, Reason: 200},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_DROPPED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				EventType: &flow.CiliumEventType{Type: 1}, Interface: &flow.NetworkInterface{Index: 9},
				Summary: "proto-0 (drop reason reason-200)",
			},
		},
		{
			name: "unsupported L3",
			ev:   &monitorapi.DropEvent{Time: epoch, Reason: monitorapi.DropUnsupportedL3},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_DROPPED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				DropReasonDesc: flow.DropReason_UNSUPPORTED_L3_PROTOCOL, DropReason: 139,
				EventType: &flow.CiliumEventType{Type: 1, SubType: 139}, Summary: "proto-0",
			},
		},
		{
			// An ICMPv6 error; the trace of a packet into postgres-0
			// whose direction is unknown.
			name: "ICMPv6 error, no conntrack state",
			ev: &monitorapi.TraceEvent{Time: epoch, EndpointID: 2, IfIndex: 8, Point: monitorapi.TraceToEndpoint, Flow: monitorapi.Flow{
				Src: netip.MustParseAddr("fd00::1"), Dst: dbPod.IPv6, Proto: 58, ICMPType: 1, ICMPCode: 4}},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				IP:                    &flow.IP{Source: "fd00::1", Destination: "fd00::9", IpVersion: flow.IPVersion_IPv6},
				L4:                    &flow.Layer4{Protocol: &flow.Layer4_ICMPv6{ICMPv6: &flow.ICMPv6{Type: 1, Code: 4}}},
				Destination:           c.enrich.endpointPB(db.ReadTxn(), dbPod),
				EventType:             &flow.CiliumEventType{Type: 4, SubType: 0},
				TraceObservationPoint: flow.TraceObservationPoint_TO_ENDPOINT,
				Interface:             &flow.NetworkInterface{Index: 8, Name: "lxc-db"},
				Summary:               "ICMPv6 DestinationUnreachable(code 4)",
			},
		},
		{
			// A SYN into postgres-0 that its ingress policy denied: the
			// event says the direction, whoever the source is.
			name: "policy drop",
			ev: &monitorapi.DropEvent{Time: epoch, EndpointID: 2, Reason: monitorapi.DropPolicyDenied, Flow: monitorapi.Flow{
				Src: webPod.IPv4, Dst: dbPod.IPv4, Proto: 6, SrcPort: 40000, DstPort: 5432, TCPFlags: monitorapi.TCPSyn,
				CTState: monitorapi.CTNew, Direction: monitorapi.DirectionIngress}},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_DROPPED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				IP: &flow.IP{Source: "10.244.0.5", Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
				L4: &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: 40000, DestinationPort: 5432,
					Flags: &flow.TCPFlags{SYN: true}}}},
				Source:         c.enrich.endpointPB(db.ReadTxn(), webPod),
				Destination:    c.enrich.endpointPB(db.ReadTxn(), dbPod),
				DropReasonDesc: flow.DropReason_POLICY_DENIED, DropReason: 133,
				EventType:   &flow.CiliumEventType{Type: 1, SubType: 133},
				TraceReason: flow.TraceReason_NEW, IsReply: wrapperspb.Bool(false),
				TrafficDirection: flow.TrafficDirection_INGRESS,
				Summary:          "TCP Flags: SYN",
			},
		},
		{
			// A packet from web's interface with a source that is not
			// web's: no endpoint, no direction.
			name: "invalid source",
			ev: &monitorapi.DropEvent{Time: epoch, IfIndex: 7, Reason: monitorapi.DropInvalidSource, Flow: monitorapi.Flow{
				Src: netip.MustParseAddr("10.244.0.77"), Dst: dbPod.IPv4, Proto: 17, SrcPort: 53, DstPort: 5432, CTState: monitorapi.CTUnknown}},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_DROPPED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				IP:             &flow.IP{Source: "10.244.0.77", Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
				L4:             &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: 53, DestinationPort: 5432}}},
				Destination:    c.enrich.endpointPB(db.ReadTxn(), dbPod),
				DropReasonDesc: flow.DropReason_INVALID_SOURCE_IP, DropReason: 132,
				EventType: &flow.CiliumEventType{Type: 1, SubType: 132},
				Interface: &flow.NetworkInterface{Index: 7},
				Summary:   "UDP",
			},
		},
		{
			name: "policy verdict",
			ev: &monitorapi.PolicyVerdictEvent{Time: epoch, EndpointID: 1, Match: monitorapi.PolicyMatchL3L4, Flow: monitorapi.Flow{
				Src: webPod.IPv4, Dst: dbPod.IPv4, Proto: 6, SrcPort: 40000, DstPort: 5432, TCPFlags: monitorapi.TCPSyn,
				CTState: monitorapi.CTNew, Direction: monitorapi.DirectionEgress}},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				IP: &flow.IP{Source: "10.244.0.5", Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
				L4: &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: 40000, DestinationPort: 5432,
					Flags: &flow.TCPFlags{SYN: true}}}},
				Source:          c.enrich.endpointPB(db.ReadTxn(), webPod),
				Destination:     c.enrich.endpointPB(db.ReadTxn(), dbPod),
				EventType:       &flow.CiliumEventType{Type: 5},
				PolicyMatchType: 2,
				TraceReason:     flow.TraceReason_NEW, IsReply: wrapperspb.Bool(false),
				TrafficDirection: flow.TrafficDirection_EGRESS,
				Summary:          "TCP Flags: SYN",
			},
		},
		{
			// The interface is not the endpoint's: no name.
			name: "SCTP, an interface not the endpoint's",
			ev: &monitorapi.TraceEvent{Time: epoch, EndpointID: 1, IfIndex: 99, Point: monitorapi.TraceFromEndpoint, Flow: monitorapi.Flow{
				Src: webPod.IPv4, Dst: netip.MustParseAddr("10.244.0.77"), Proto: 132, SrcPort: 1000, DstPort: 2000, CTState: monitorapi.CTEstablished}},
			want: &flow.Flow{
				Time: timestamppb.New(epoch), Verdict: flow.Verdict_FORWARDED, Type: flow.FlowType_L3_L4, NodeName: "node-1",
				IP:                    &flow.IP{Source: "10.244.0.5", Destination: "10.244.0.77", IpVersion: flow.IPVersion_IPv4},
				L4:                    &flow.Layer4{Protocol: &flow.Layer4_SCTP{SCTP: &flow.SCTP{SourcePort: 1000, DestinationPort: 2000}}},
				Source:                c.enrich.endpointPB(db.ReadTxn(), webPod),
				EventType:             &flow.CiliumEventType{Type: 4, SubType: 5},
				TraceObservationPoint: flow.TraceObservationPoint_FROM_ENDPOINT, TraceReason: flow.TraceReason_ESTABLISHED,
				IsReply: wrapperspb.Bool(false), TrafficDirection: flow.TrafficDirection_EGRESS,
				Interface: &flow.NetworkInterface{Index: 99},
				Summary:   "SCTP",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.flowOf(db.ReadTxn(), tc.ev); !proto.Equal(got, tc.want) {
				t.Fatalf("flow\n got %v\nwant %v", got, tc.want)
			}
		})
	}
	if f := c.flowOf(db.ReadTxn(), &monitorapi.AgentEvent{}); f != nil {
		t.Fatalf("agent event made flow %v", f)
	}
}

// Rows are immutable: a changed endpoint is a new row, and its flows show
// the change.
func TestEnrichmentFollowsChangedRows(t *testing.T) {
	c, db := newTestConverter(t)
	ev := &monitorapi.TraceEvent{Time: epoch, EndpointID: 1, Point: monitorapi.TraceFromEndpoint, Flow: monitorapi.Flow{Src: webPod.IPv4, Dst: dbPod.IPv4, Proto: 17}}
	before := c.flowOf(db.ReadTxn(), ev)
	relabelled := webPod.Clone()
	relabelled.Labels["tier"] = "front"
	eps := c.enrich.Endpoints.(statedb.RWTable[*endpointmanager.Endpoint])
	txn := db.WriteTxn(eps)
	eps.Insert(txn, relabelled)
	txn.Commit()
	after := c.flowOf(db.ReadTxn(), ev)
	if got := after.GetSource().GetLabels(); len(got) != 3 || got[2] != "k8s:tier=front" {
		t.Fatalf("labels after the change %v, want tier=front added", got)
	}
	if len(before.GetSource().GetLabels()) != 2 {
		t.Fatalf("the earlier flow changed: %v", before.GetSource().GetLabels())
	}
}

func TestAgentEventOf(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		ev   *monitorapi.AgentEvent
		want *flow.AgentEvent
	}{
		{&monitorapi.AgentEvent{Type: monitorapi.AgentStarted, Message: "agent v1 started", Time: at},
			&flow.AgentEvent{Type: flow.AgentEventType_AGENT_STARTED, Notification: &flow.AgentEvent_AgentStart{AgentStart: &flow.TimeNotification{Time: timestamppb.New(at)}}}},
		{&monitorapi.AgentEvent{Type: monitorapi.EndpointCreated, Message: "endpoint 3 pod default/web-2"},
			unknownAgentEvent(flow.AgentEventType_ENDPOINT_CREATED, monitorapi.EndpointCreated, "endpoint 3 pod default/web-2")},
		{&monitorapi.AgentEvent{Type: monitorapi.EndpointDeleted, Message: "m"}, unknownAgentEvent(flow.AgentEventType_ENDPOINT_DELETED, monitorapi.EndpointDeleted, "m")},
		{&monitorapi.AgentEvent{Type: monitorapi.ServiceUpdated, Message: "m"}, unknownAgentEvent(flow.AgentEventType_SERVICE_UPSERTED, monitorapi.ServiceUpdated, "m")},
		{&monitorapi.AgentEvent{Type: monitorapi.ServiceDeleted, Message: "m"}, unknownAgentEvent(flow.AgentEventType_SERVICE_DELETED, monitorapi.ServiceDeleted, "m")},
		{&monitorapi.AgentEvent{Type: "something-new", Message: "m"}, unknownAgentEvent(flow.AgentEventType_AGENT_EVENT_UNKNOWN, "something-new", "m")},
	} {
		if got := agentEventOf(tc.ev); !proto.Equal(got, tc.want) {
			t.Errorf("agentEventOf(%+v) = %v, want %v", tc.ev, got, tc.want)
		}
	}
}

func unknownAgentEvent(typ flow.AgentEventType, name, msg string) *flow.AgentEvent {
	return &flow.AgentEvent{Type: typ, Notification: &flow.AgentEvent_Unknown{Unknown: &flow.AgentEventUnknown{Type: name, Notification: msg}}}
}

// TestFlowIdentities: a flow's endpoints carry the identities the datapath
// found; a local endpoint is named by its row, with its identity's labels
// once the node knows it; another node's pod by the namespace and name its
// node published (ipcache) and its identity's labels; any other address by
// its identity, a reserved one by its name.
func TestFlowIdentities(t *testing.T) {
	c, db := newTestConverter(t)
	eps := c.enrich.Endpoints.(statedb.RWTable[*endpointmanager.Endpoint])
	ids := c.enrich.Identities.(statedb.RWTable[*idalloc.Identity])
	ipc := c.enrich.IPCache.(statedb.RWTable[*ipcache.Entry])
	web := webPod.Clone()
	web.Identity = 1 << 24
	api := netip.MustParseAddr("10.244.1.20")
	txn := db.WriteTxn(eps, ids, ipc)
	eps.Insert(txn, web)
	ids.Insert(txn, &idalloc.Identity{ID: 300, Kind: idalloc.KindCluster,
		Labels: labels.New(labels.Label{Source: "k8s", Key: "app", Value: "api"}, labels.Label{Source: "k8s", Key: labelPodNamespace, Value: "shop"})})
	ipc.Insert(txn, &ipcache.Entry{Prefix: netip.PrefixFrom(api, 32),
		Claims: []ipcache.Claim{{Source: ipcache.SourceKVStore, Identity: 300, Namespace: "shop", PodName: "api-7"}}})
	txn.Commit()

	ev := &monitorapi.TraceEvent{Time: epoch, EndpointID: web.ID, Point: monitorapi.TraceToStack, Flow: monitorapi.Flow{
		Src: web.IPv4, Dst: netip.MustParseAddr("192.0.2.1"), Proto: 17, SrcPort: 5000, DstPort: 53,
		SrcIdentity: 1 << 24, DstIdentity: 2}}
	f := c.flowOf(db.ReadTxn(), ev)
	if f.Source.GetIdentity() != 1<<24 || f.Source.GetPodName() != web.PodName ||
		!slices.Equal(f.Source.GetLabels(), []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"}) {
		t.Errorf("source %v, want the web pod with identity %d and its pod labels (the identity is not in the table)", f.Source, 1<<24)
	}
	if f.Destination.GetIdentity() != 2 || !slices.Equal(f.Destination.GetLabels(), []string{"reserved:world"}) {
		t.Errorf("destination %v, want identity 2 labelled reserved:world", f.Destination)
	}

	// Another node's pod.
	ev.Flow.Dst, ev.Flow.DstIdentity = api, 300
	f = c.flowOf(db.ReadTxn(), ev)
	want := &flow.Endpoint{Identity: 300, Namespace: "shop", PodName: "api-7", Labels: []string{"k8s:app=api", "k8s:io.kubernetes.pod.namespace=shop"}}
	if !proto.Equal(f.Destination, want) {
		t.Errorf("remote destination\n got %v\nwant %v", f.Destination, want)
	}
	// The datapath's identity names the peer: an ipcache entry of another
	// identity (a stale one) lends it no pod.
	ev.Flow.DstIdentity = 301
	if f := c.flowOf(db.ReadTxn(), ev); f.Destination.GetPodName() != "" || f.Destination.GetIdentity() != 301 {
		t.Errorf("destination with another identity than the ipcache's: %v", f.Destination)
	}

	// Once the local identity is in the table, its labels name the pod.
	txn = db.WriteTxn(ids)
	ids.Insert(txn, &idalloc.Identity{ID: 1 << 24, Kind: idalloc.KindLocal,
		Labels: labels.New(labels.Label{Source: "k8s", Key: "app", Value: "web"}, labels.Label{Source: "k8s", Key: "io.cellium.k8s.policy.serviceaccount", Value: "web"})})
	txn.Commit()
	f = c.flowOf(db.ReadTxn(), ev)
	if !slices.Equal(f.Source.GetLabels(), []string{"k8s:app=web", "k8s:io.cellium.k8s.policy.serviceaccount=web"}) {
		t.Errorf("source labels %v, want its identity's", f.Source.GetLabels())
	}

	// An address the ipcache has no prefix for has no endpoint.
	ev.Flow.DstIdentity = 0
	if f := c.flowOf(db.ReadTxn(), ev); f.Destination != nil {
		t.Errorf("destination without identity: %v, want none", f.Destination)
	}
}
