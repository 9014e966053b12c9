package hubble

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/cilium/api/v1/flow"
	"github.com/cilium/statedb"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// Event types of flows (flow.CiliumEventType.Type): the numbers of
// Cilium's monitor API, which the hubble CLI's --type filter sends.
const (
	eventTypeDrop      = 1
	eventTypeTrace     = 4
	eventTypePolicy    = 5
	eventTypeTraceSock = 7
)

// Trace sub-types in Cilium's numbering, so that `hubble observe --type
// trace:to-endpoint` selects what it says.
const (
	traceSubToEndpoint   = 0
	traceSubToStack      = 3
	traceSubFromEndpoint = 5
)

// tracePoints maps the datapath's trace points to the flow's observation
// point and Cilium's trace sub-type.
var tracePoints = map[monitorapi.TracePoint]struct {
	point flow.TraceObservationPoint
	sub   int32
}{
	monitorapi.TraceFromEndpoint: {flow.TraceObservationPoint_FROM_ENDPOINT, traceSubFromEndpoint},
	monitorapi.TraceToEndpoint:   {flow.TraceObservationPoint_TO_ENDPOINT, traceSubToEndpoint},
	monitorapi.TraceToStack:      {flow.TraceObservationPoint_TO_STACK, traceSubToStack},
}

// dropReasons maps the datapath's drop reasons to Hubble's, whose numbers
// are Cilium's drop codes.
var dropReasons = map[monitorapi.DropReason]flow.DropReason{
	monitorapi.DropInvalidPacket:  flow.DropReason_INVALID_PACKET_DROPPED,
	monitorapi.DropUnsupportedL3:  flow.DropReason_UNSUPPORTED_L3_PROTOCOL,
	monitorapi.DropCTCreateFailed: flow.DropReason_CT_MAP_INSERTION_FAILED,
	monitorapi.DropPolicyDenied:   flow.DropReason_POLICY_DENIED,
	monitorapi.DropInvalidSource:  flow.DropReason_INVALID_SOURCE_IP,
}

// policyMatchTypes maps the kinds of policy match to Cilium's numbers
// (flow.Flow.PolicyMatchType); the host's ingress is an identity match.
var policyMatchTypes = map[monitorapi.PolicyMatch]uint32{
	monitorapi.PolicyMatchL3Only: 1,
	monitorapi.PolicyMatchHost:   1,
	monitorapi.PolicyMatchL3L4:   2,
	monitorapi.PolicyMatchL4Only: 3,
	monitorapi.PolicyMatchAll:    4,
}

// directions maps the datapath's policy directions to Hubble's.
var directions = map[monitorapi.Direction]flow.TrafficDirection{
	monitorapi.DirectionIngress: flow.TrafficDirection_INGRESS,
	monitorapi.DirectionEgress:  flow.TrafficDirection_EGRESS,
}

// agentEventTypes maps the monitor's agent notifications to Hubble's.
var agentEventTypes = map[string]flow.AgentEventType{
	monitorapi.AgentStarted:    flow.AgentEventType_AGENT_STARTED,
	monitorapi.EndpointCreated: flow.AgentEventType_ENDPOINT_CREATED,
	monitorapi.EndpointDeleted: flow.AgentEventType_ENDPOINT_DELETED,
	monitorapi.ServiceUpdated:  flow.AgentEventType_SERVICE_UPSERTED, //nolint:staticcheck // the type Hubble has for it
	monitorapi.ServiceDeleted:  flow.AgentEventType_SERVICE_DELETED,  //nolint:staticcheck // the type Hubble has for it
}

// converter turns monitor events into flows, enriched from the agent's
// tables. It is used by one goroutine only.
type converter struct {
	node   string
	enrich *enricher
}

func newConverter(node string, tables Tables) *converter {
	return &converter{node: node, enrich: newEnricher(tables)}
}

// flowOf is the flow of a datapath event, or nil for an event that is no
// flow (an agent notification). txn is a snapshot of the tables.
func (c *converter) flowOf(txn statedb.ReadTxn, ev monitorapi.Event) *flow.Flow {
	switch ev := ev.(type) {
	case *monitorapi.TraceEvent:
		return c.traceFlow(txn, ev)
	case *monitorapi.DropEvent:
		return c.dropFlow(txn, ev)
	case *monitorapi.PolicyVerdictEvent:
		return c.policyFlow(txn, ev)
	case *monitorapi.SockLBEvent:
		return c.sockFlow(txn, ev)
	}
	return nil
}

// packetFlow fills what trace and drop flows share: the packet's
// addresses and ports, the endpoints and services at them, the interface.
func (c *converter) packetFlow(txn statedb.ReadTxn, t *timestamppb.Timestamp, endpointID uint16, ifindex uint32, pkt *monitorapi.Flow) *flow.Flow {
	f := &flow.Flow{
		Time:     t,
		Type:     flow.FlowType_L3_L4,
		NodeName: c.node,
		IP:       ipOf(pkt.Src, pkt.Dst),
		L4:       l4Of(pkt),
		Summary:  summaryOf(pkt),
	}
	f.Source = c.enrich.peerAt(txn, pkt.Src, pkt.SrcIdentity)
	f.Destination = c.enrich.peerAt(txn, pkt.Dst, pkt.DstIdentity)
	proto := l4Proto(pkt.Proto)
	f.SourceService = c.enrich.serviceAt(txn, pkt.Src, pkt.SrcPort, proto)
	f.DestinationService = c.enrich.serviceAt(txn, pkt.Dst, pkt.DstPort, proto)
	if ifindex != 0 {
		f.Interface = &flow.NetworkInterface{Index: ifindex}
		// The programs run on endpoints' host-side veths: name it when the
		// endpoint that saw the packet has it.
		if row := c.enrich.endpointRow(txn, endpointID); row != nil && row.HostIfIndex == int(ifindex) {
			f.Interface.Name = row.HostIfName
		}
	}
	if s := pkt.CTState; s != monitorapi.CTUnknown {
		f.IsReply = wrapperspb.Bool(s == monitorapi.CTReply)
		f.TraceReason = traceReason(s)
	}
	return f
}

func (c *converter) traceFlow(txn statedb.ReadTxn, ev *monitorapi.TraceEvent) *flow.Flow {
	f := c.packetFlow(txn, timestamppb.New(ev.Time), ev.EndpointID, ev.IfIndex, &ev.Flow)
	f.Verdict = flow.Verdict_FORWARDED
	tp, known := tracePoints[ev.Point]
	if !known {
		tp.sub = int32(ev.Point)
	}
	f.TraceObservationPoint = tp.point
	f.EventType = &flow.CiliumEventType{Type: eventTypeTrace, SubType: tp.sub}
	// The program that saw the packet runs for endpoint EndpointID: a
	// packet from it leaves it (egress) unless it answers a connection
	// made to it.
	if f.IsReply != nil && ev.EndpointID != 0 {
		fromEndpoint := ev.Point == monitorapi.TraceFromEndpoint || ev.Point == monitorapi.TraceToStack
		if fromEndpoint != f.IsReply.GetValue() {
			f.TrafficDirection = flow.TrafficDirection_EGRESS
		} else {
			f.TrafficDirection = flow.TrafficDirection_INGRESS
		}
	}
	return f
}

func (c *converter) dropFlow(txn statedb.ReadTxn, ev *monitorapi.DropEvent) *flow.Flow {
	f := c.packetFlow(txn, timestamppb.New(ev.Time), ev.EndpointID, ev.IfIndex, &ev.Flow)
	f.Verdict = flow.Verdict_DROPPED
	f.DropReasonDesc = dropReasons[ev.Reason]
	f.DropReason = uint32(f.DropReasonDesc) //nolint:staticcheck // older clients read the number
	f.EventType = &flow.CiliumEventType{Type: eventTypeDrop, SubType: int32(f.DropReasonDesc)}
	// A drop by the program of the endpoint the packet came from stops it
	// leaving; any other stops it arriving. A policy drop says which.
	if d, ok := directions[ev.Flow.Direction]; ok {
		f.TrafficDirection = d
	} else if ev.EndpointID != 0 && f.Source != nil {
		if f.Source.ID == uint32(ev.EndpointID) {
			f.TrafficDirection = flow.TrafficDirection_EGRESS
		} else {
			f.TrafficDirection = flow.TrafficDirection_INGRESS
		}
	}
	if f.DropReasonDesc == flow.DropReason_DROP_REASON_UNKNOWN {
		f.Summary = strings.TrimSpace(f.Summary + " (drop reason " + ev.Reason.String() + ")")
	}
	return f
}

// policyFlow is the flow of a new connection that an isolated endpoint's
// policy allowed, as Cilium's policy-verdict events show it.
func (c *converter) policyFlow(txn statedb.ReadTxn, ev *monitorapi.PolicyVerdictEvent) *flow.Flow {
	f := c.packetFlow(txn, timestamppb.New(ev.Time), ev.EndpointID, ev.IfIndex, &ev.Flow)
	f.Verdict = flow.Verdict_FORWARDED
	f.EventType = &flow.CiliumEventType{Type: eventTypePolicy}
	f.PolicyMatchType = policyMatchTypes[ev.Match]
	f.TrafficDirection = directions[ev.Flow.Direction]
	if allowedBy := c.enrich.allowedBy(txn, ev.Flow.PolicyCookie); len(allowedBy) > 0 {
		if ev.Flow.Direction == monitorapi.DirectionEgress {
			f.EgressAllowedBy = allowedBy
		} else {
			f.IngressAllowedBy = allowedBy
		}
	}
	return f
}

// sockFlow is the flow of a socket translation, in the form of Hubble's
// post-translation socket trace: for connect and sendmsg (forward) the
// destination is the backend the socket was sent to and
// destination_service the service whose frontend the application asked
// for; for recvmsg and getpeername (reverse) the source is the frontend the
// application is shown and source_service its service. The source (forward)
// or destination (reverse) is the socket's own end, which the event does not
// carry.
func (c *converter) sockFlow(txn statedb.ReadTxn, ev *monitorapi.SockLBEvent) *flow.Flow {
	reverse := ev.Hook == monitorapi.SockLBRecvmsg || ev.Hook == monitorapi.SockLBGetpeername
	point := flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_FWD
	// peer is the address the socket has after the translation.
	frontend, peer := ev.Original, ev.Translated
	if reverse {
		point = flow.SocketTranslationPoint_SOCK_XLATE_POINT_POST_DIRECTION_REV
		frontend = ev.Translated
	}
	proto := l4Proto(ev.Proto)
	svc := c.enrich.serviceAt(txn, frontend.Addr(), frontend.Port(), proto)

	f := &flow.Flow{
		Time:           timestamppb.New(ev.Time),
		Verdict:        flow.Verdict_TRANSLATED,
		Type:           flow.FlowType_SOCK,
		NodeName:       c.node,
		EventType:      &flow.CiliumEventType{Type: eventTypeTraceSock, SubType: int32(point)},
		SockXlatePoint: point,
		SocketCookie:   ev.SockCookie,
	}
	var srcPort, dstPort uint16
	if reverse {
		f.IP = &flow.IP{Source: peer.Addr().String(), IpVersion: ipVersion(peer.Addr())}
		srcPort = peer.Port()
		f.Source = c.enrich.endpointAt(txn, peer.Addr())
		f.SourceService = svc
	} else {
		f.IP = &flow.IP{Destination: peer.Addr().String(), IpVersion: ipVersion(peer.Addr())}
		dstPort = peer.Port()
		f.Destination = c.enrich.endpointAt(txn, peer.Addr())
		f.DestinationService = svc
	}
	switch ev.Proto {
	case unix.IPPROTO_TCP:
		f.L4 = &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: uint32(srcPort), DestinationPort: uint32(dstPort)}}}
	case unix.IPPROTO_UDP:
		f.L4 = &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: uint32(srcPort), DestinationPort: uint32(dstPort)}}}
	}
	f.Summary = fmt.Sprintf("%s %s %s -> %s", ev.Proto, ev.Hook, ev.Original, ev.Translated)
	if svc != nil {
		f.Summary += fmt.Sprintf(" (service %s/%s)", svc.Namespace, svc.Name)
	}
	return f
}

// agentEventOf is Hubble's form of an agent notification. Only the agent's
// start has a structured notification; the others carry the monitor's
// message as text.
func agentEventOf(ev *monitorapi.AgentEvent) *flow.AgentEvent {
	typ := agentEventTypes[ev.Type]
	if typ == flow.AgentEventType_AGENT_STARTED {
		return &flow.AgentEvent{Type: typ, Notification: &flow.AgentEvent_AgentStart{
			AgentStart: &flow.TimeNotification{Time: timestamppb.New(ev.Time)},
		}}
	}
	return &flow.AgentEvent{Type: typ, Notification: &flow.AgentEvent_Unknown{
		Unknown: &flow.AgentEventUnknown{Type: ev.Type, Notification: ev.Message},
	}}
}

func ipVersion(a netip.Addr) flow.IPVersion {
	switch {
	case !a.IsValid():
		return flow.IPVersion_IP_NOT_USED
	case a.Is4():
		return flow.IPVersion_IPv4
	}
	return flow.IPVersion_IPv6
}

// ipOf is the flow's IP layer, nil for a packet whose addresses were never
// read (dropped before).
func ipOf(src, dst netip.Addr) *flow.IP {
	if !src.IsValid() && !dst.IsValid() {
		return nil
	}
	ip := &flow.IP{IpVersion: ipVersion(src)}
	if src.IsValid() {
		ip.Source = src.String()
	}
	if dst.IsValid() {
		ip.Destination = dst.String()
		ip.IpVersion = ipVersion(dst)
	}
	return ip
}

func l4Of(pkt *monitorapi.Flow) *flow.Layer4 {
	sport, dport := uint32(pkt.SrcPort), uint32(pkt.DstPort)
	switch pkt.Proto {
	case unix.IPPROTO_TCP:
		return &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: sport, DestinationPort: dport, Flags: tcpFlagsOf(pkt.TCPFlags)}}}
	case unix.IPPROTO_UDP:
		return &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: sport, DestinationPort: dport}}}
	case unix.IPPROTO_SCTP:
		return &flow.Layer4{Protocol: &flow.Layer4_SCTP{SCTP: &flow.SCTP{SourcePort: sport, DestinationPort: dport}}}
	case unix.IPPROTO_ICMP:
		return &flow.Layer4{Protocol: &flow.Layer4_ICMPv4{ICMPv4: &flow.ICMPv4{Type: uint32(pkt.ICMPType), Code: uint32(pkt.ICMPCode)}}}
	case unix.IPPROTO_ICMPV6:
		return &flow.Layer4{Protocol: &flow.Layer4_ICMPv6{ICMPv6: &flow.ICMPv6{Type: uint32(pkt.ICMPType), Code: uint32(pkt.ICMPCode)}}}
	}
	return nil
}

func tcpFlagsOf(f monitorapi.TCPFlags) *flow.TCPFlags {
	return &flow.TCPFlags{
		FIN: f&monitorapi.TCPFin != 0,
		SYN: f&monitorapi.TCPSyn != 0,
		RST: f&monitorapi.TCPRst != 0,
		PSH: f&monitorapi.TCPPsh != 0,
		ACK: f&monitorapi.TCPAck != 0,
		URG: f&monitorapi.TCPUrg != 0,
		ECE: f&monitorapi.TCPEce != 0,
		CWR: f&monitorapi.TCPCwr != 0,
	}
}

// l4Proto is the load balancer's protocol of an IP protocol, 0 for one it
// does not balance.
func l4Proto(p monitorapi.Proto) loadbalancer.L4Proto {
	switch p {
	case unix.IPPROTO_TCP:
		return loadbalancer.TCP
	case unix.IPPROTO_UDP:
		return loadbalancer.UDP
	case unix.IPPROTO_SCTP:
		return loadbalancer.SCTP
	}
	return 0
}

func traceReason(s monitorapi.CTState) flow.TraceReason {
	switch s {
	case monitorapi.CTNew:
		return flow.TraceReason_NEW
	case monitorapi.CTEstablished:
		return flow.TraceReason_ESTABLISHED
	case monitorapi.CTReply:
		return flow.TraceReason_REPLY
	case monitorapi.CTRelated:
		return flow.TraceReason_RELATED
	}
	return flow.TraceReason_TRACE_REASON_UNKNOWN
}

// tcpFlagOrder is the order in which Hubble's summaries list TCP flags.
var tcpFlagOrder = []struct {
	flag monitorapi.TCPFlags
	name string
}{
	{monitorapi.TCPSyn, "SYN"}, {monitorapi.TCPAck, "ACK"}, {monitorapi.TCPRst, "RST"}, {monitorapi.TCPFin, "FIN"},
	{monitorapi.TCPPsh, "PSH"}, {monitorapi.TCPUrg, "URG"}, {monitorapi.TCPEce, "ECE"}, {monitorapi.TCPCwr, "CWR"},
}

// ICMP type names as Hubble's summaries spell them.
var (
	icmpv4Types = map[uint8]string{
		0: "EchoReply", 3: "DestinationUnreachable", 5: "Redirect", 8: "EchoRequest", 11: "TimeExceeded", 12: "ParameterProblem",
	}
	icmpv6Types = map[uint8]string{
		1: "DestinationUnreachable", 2: "PacketTooBig", 3: "TimeExceeded", 4: "ParameterProblem",
		128: "EchoRequest", 129: "EchoReply", 133: "RouterSolicitation", 134: "RouterAdvertisement",
		135: "NeighborSolicitation", 136: "NeighborAdvertisement",
	}
)

// summaryOf is the one-line summary Hubble gives a packet: "TCP Flags:
// SYN, ACK", "UDP", "ICMPv4 EchoRequest".
func summaryOf(pkt *monitorapi.Flow) string {
	switch pkt.Proto {
	case unix.IPPROTO_TCP:
		var names []string
		for _, f := range tcpFlagOrder {
			if pkt.TCPFlags&f.flag != 0 {
				names = append(names, f.name)
			}
		}
		return "TCP Flags: " + strings.Join(names, ", ")
	case unix.IPPROTO_ICMP:
		return icmpSummary("ICMPv4", icmpv4Types, pkt.ICMPType, pkt.ICMPCode)
	case unix.IPPROTO_ICMPV6:
		return icmpSummary("ICMPv6", icmpv6Types, pkt.ICMPType, pkt.ICMPCode)
	}
	return pkt.Proto.String()
}

func icmpSummary(proto string, names map[uint8]string, typ, code uint8) string {
	name, ok := names[typ]
	if !ok {
		return fmt.Sprintf("%s type %d code %d", proto, typ, code)
	}
	if code != 0 {
		return fmt.Sprintf("%s %s(code %d)", proto, name, code)
	}
	return proto + " " + name
}
