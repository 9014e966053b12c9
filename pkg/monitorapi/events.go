package monitorapi

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cellium/cellium/pkg/ctmap"
)

// Record types: the first byte of every record (EVENT_* in events.h).
const (
	RecordTrace  uint8 = 1
	RecordDrop   uint8 = 2
	RecordSockLB uint8 = 3
	// RecordPolicyVerdict carries a flow summary, as RecordTrace does.
	RecordPolicyVerdict uint8 = 4
)

// Sizes of the parts of a record.
const (
	HeaderLen        = 16
	FlowSummaryLen   = 64
	SockLBSummaryLen = 64
)

// Kinds of events, as Event.Kind returns them.
const (
	KindTrace  = "trace"
	KindDrop   = "drop"
	KindSockLB = "sock-lb"
	KindPolicy = "policy-verdict"
	KindAgent  = "agent"
)

// Kinds lists every kind, for flag validation and help texts.
var Kinds = []string{KindTrace, KindDrop, KindSockLB, KindPolicy, KindAgent}

// Event is a decoded datapath event or an agent notification: one of
// *TraceEvent, *DropEvent, *SockLBEvent, *PolicyVerdictEvent, *AgentEvent.
type Event interface {
	Kind() string
}

// codeNames names the codes of a one-byte field of the records. A code
// without a name reads as the fallback format ("reason-7"), so that an
// event of a newer datapath still prints, and parses back.
type codeNames[T ~uint8] map[T]string

func (n codeNames[T]) name(code T, fallback string) string {
	if name, ok := n[code]; ok {
		return name
	}
	return fmt.Sprintf(fallback, uint8(code))
}

func (n codeNames[T]) parse(code *T, b []byte, what, fallback string) error {
	for v, name := range n {
		if name == string(b) {
			*code = v
			return nil
		}
	}
	var c uint8
	if _, err := fmt.Sscanf(string(b), fallback, &c); err == nil && fmt.Sprintf(fallback, c) == string(b) {
		*code = T(c)
		return nil
	}
	names := slices.Sorted(maps.Values(n))
	return fmt.Errorf("invalid %s %q: want one of %s", what, b, strings.Join(names, ", "))
}

// TracePoint is where a program saw a packet (TRACE_* in events.h).
type TracePoint uint8

const (
	// TraceFromEndpoint: the from-endpoint program (tcx ingress of the
	// endpoint's host-side veth) saw a packet from the endpoint to another
	// endpoint of this node, whose to-endpoint program will see it next.
	TraceFromEndpoint TracePoint = 1
	// TraceToEndpoint: the to-endpoint program (tcx egress of the host-side
	// veth) passed a packet into the endpoint.
	TraceToEndpoint TracePoint = 2
	// TraceToStack: the from-endpoint program passed a packet from the
	// endpoint to the host's stack for a destination that is no endpoint
	// of this node: the host itself, another node, the outside.
	TraceToStack TracePoint = 3
)

var tracePointNames = codeNames[TracePoint]{
	TraceFromEndpoint: "from-endpoint",
	TraceToEndpoint:   "to-endpoint",
	TraceToStack:      "to-stack",
}

func (p TracePoint) String() string { return tracePointNames.name(p, "point-%d") }

func (p TracePoint) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *TracePoint) UnmarshalText(b []byte) error {
	return tracePointNames.parse(p, b, "trace point", "point-%d")
}

// DropReason says why a program dropped a packet (DROP_* in events.h).
type DropReason uint8

const (
	// DropInvalidPacket: truncated or inconsistent headers (an IPv4
	// header length below 20 bytes, a total length beyond the packet, a
	// TCP header cut short, ...).
	DropInvalidPacket DropReason = 1
	// DropUnsupportedL3: an EtherType other than IPv4, IPv6 and ARP.
	DropUnsupportedL3 DropReason = 2
	// DropCTCreateFailed: the conntrack map refused the connection's new
	// entry.
	DropCTCreateFailed DropReason = 3
	// DropPolicyDenied: the endpoint is isolated in the flow's Direction
	// and no policy entry allows the packet's new connection.
	DropPolicyDenied DropReason = 4
	// DropInvalidSource: a packet an endpoint sent whose source address
	// is not one of that endpoint's (the endpoint map's entry of the
	// source is not the interface the packet came in on).
	DropInvalidSource DropReason = 5
)

var dropReasonNames = codeNames[DropReason]{
	DropInvalidPacket:  "invalid-packet",
	DropUnsupportedL3:  "unsupported-l3",
	DropCTCreateFailed: "ct-create-failed",
	DropPolicyDenied:   "policy-denied",
	DropInvalidSource:  "invalid-source",
}

// DropReasonName names a drop reason code: "invalid-packet", ..., or
// "reason-N" for a code this agent does not know.
func DropReasonName(code uint8) string { return dropReasonNames.name(DropReason(code), "reason-%d") }

func (r DropReason) String() string { return DropReasonName(uint8(r)) }

func (r DropReason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

func (r *DropReason) UnmarshalText(b []byte) error {
	return dropReasonNames.parse(r, b, "drop reason", "reason-%d")
}

// Direction is the policy direction of the endpoint whose program made a
// policy decision (TRAFFIC_* in events.h): ingress into it, egress out of
// it; DirectionUnknown on events that no policy decision made.
type Direction uint8

const (
	DirectionUnknown Direction = 0
	DirectionIngress Direction = 1
	DirectionEgress  Direction = 2
)

var directionNames = codeNames[Direction]{
	DirectionUnknown: "unknown",
	DirectionIngress: "ingress",
	DirectionEgress:  "egress",
}

func (d Direction) String() string { return directionNames.name(d, "direction-%d") }

func (d Direction) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d *Direction) UnmarshalText(b []byte) error {
	return directionNames.parse(d, b, "direction", "direction-%d")
}

// PolicyMatch is the kind of policy entry that allowed a new connection
// (POLICY_MATCH_* in events.h).
type PolicyMatch uint8

const (
	// PolicyMatchL3L4: the peer's identity, with the protocol and port.
	PolicyMatchL3L4 PolicyMatch = 1
	// PolicyMatchL3Only: the peer's identity, any protocol.
	PolicyMatchL3Only PolicyMatch = 2
	// PolicyMatchL4Only: any peer, the protocol and port.
	PolicyMatchL4Only PolicyMatch = 3
	// PolicyMatchAll: any peer, any protocol.
	PolicyMatchAll PolicyMatch = 4
	// PolicyMatchHost: ingress from the endpoint's own node, which
	// policy always allows.
	PolicyMatchHost PolicyMatch = 5
)

var policyMatchNames = codeNames[PolicyMatch]{
	PolicyMatchL3L4:   "l3-l4",
	PolicyMatchL3Only: "l3-only",
	PolicyMatchL4Only: "l4-only",
	PolicyMatchAll:    "all",
	PolicyMatchHost:   "host",
}

func (m PolicyMatch) String() string { return policyMatchNames.name(m, "match-%d") }

func (m PolicyMatch) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m *PolicyMatch) UnmarshalText(b []byte) error {
	return policyMatchNames.parse(m, b, "policy match", "match-%d")
}

// SockLBHook is the socket operation a socket translation happened in
// (SOCK_LB_HOOK_* in events.h).
type SockLBHook uint8

const (
	// SockLBConnect: connect() to a service frontend went to a backend.
	SockLBConnect SockLBHook = 1
	// SockLBSendmsg: an unconnected UDP sendto() to a frontend.
	SockLBSendmsg SockLBHook = 2
	// SockLBRecvmsg: a UDP reply from a backend shown as from the frontend.
	SockLBRecvmsg SockLBHook = 3
	// SockLBGetpeername: getpeername() of a translated socket shows the
	// frontend.
	SockLBGetpeername SockLBHook = 4
)

var sockLBHookNames = codeNames[SockLBHook]{
	SockLBConnect:     "connect",
	SockLBSendmsg:     "sendmsg",
	SockLBRecvmsg:     "recvmsg",
	SockLBGetpeername: "getpeername",
}

func (h SockLBHook) String() string { return sockLBHookNames.name(h, "hook-%d") }

func (h SockLBHook) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

func (h *SockLBHook) UnmarshalText(b []byte) error {
	return sockLBHookNames.parse(h, b, "socket hook", "hook-%d")
}

// CTState is what conntrack made of a packet (CT_* in events.h).
type CTState uint8

const (
	// CTUnknown: the packet is not tracked (ICMP other than echo,
	// fragments after the first, ...), or was dropped before the lookup.
	CTUnknown CTState = 0
	// CTNew: the packet opened a connection (or found only an entry that
	// its SYN restarts).
	CTNew CTState = 1
	// CTEstablished: a packet of the original direction of a known
	// connection.
	CTEstablished CTState = 2
	// CTReply: a packet of the reply direction.
	CTReply CTState = 3
	// CTRelated: a packet that belongs to a known connection without being
	// part of it. The programs do not report it yet; the value is reserved
	// in the format.
	CTRelated CTState = 4
)

var ctStateNames = codeNames[CTState]{
	CTUnknown:     "unknown",
	CTNew:         "new",
	CTEstablished: "established",
	CTReply:       "reply",
	CTRelated:     "related",
}

func (s CTState) String() string { return ctStateNames.name(s, "ct-state-%d") }

func (s CTState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

func (s *CTState) UnmarshalText(b []byte) error {
	return ctStateNames.parse(s, b, "conntrack state", "ct-state-%d")
}

// TCPFlags are the flags byte of a TCP header.
type TCPFlags uint8

const (
	TCPFin TCPFlags = 1 << iota
	TCPSyn
	TCPRst
	TCPPsh
	TCPAck
	TCPUrg
	TCPEce
	TCPCwr
)

var tcpFlagNames = []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"}

// String reads "SYN|ACK", or "" for none.
func (f TCPFlags) String() string {
	var names []string
	for i, name := range tcpFlagNames {
		if f&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	return strings.Join(names, "|")
}

func (f TCPFlags) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

func (f *TCPFlags) UnmarshalText(b []byte) error {
	*f = 0
	if len(b) == 0 {
		return nil
	}
next:
	for _, name := range strings.Split(string(b), "|") {
		for i, n := range tcpFlagNames {
			if n == name {
				*f |= 1 << i
				continue next
			}
		}
		return fmt.Errorf("invalid TCP flag %q in %q: want FIN, SYN, RST, PSH, ACK, URG, ECE or CWR", name, b)
	}
	return nil
}

// Proto is an IP protocol number that reads as its name ("TCP", "UDP",
// "ICMP", "ICMPv6", "proto-N").
type Proto uint8

func (p Proto) String() string { return ctmap.ProtoName(uint8(p)) }

func (p Proto) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

func (p *Proto) UnmarshalText(b []byte) error {
	for _, v := range []Proto{unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6, unix.IPPROTO_SCTP} {
		if v.String() == string(b) {
			*p = v
			return nil
		}
	}
	var n uint8
	if _, err := fmt.Sscanf(string(b), "proto-%d", &n); err == nil {
		*p = Proto(n)
		return nil
	}
	return fmt.Errorf("invalid protocol %q", b)
}

// Flow is the summary of a packet that trace and drop events carry.
type Flow struct {
	// Src and Dst are invalid (the zero Addr) for a packet dropped before
	// its addresses were read.
	Src   netip.Addr `json:"src,omitzero"`
	Dst   netip.Addr `json:"dst,omitzero"`
	Proto Proto      `json:"proto"`
	// SrcPort and DstPort are in host order; 0 for protocols without
	// ports. For ICMP echo they are those of the conntrack key: the
	// identifier as SrcPort of a request and DstPort of a reply.
	SrcPort  uint16   `json:"srcPort,omitempty"`
	DstPort  uint16   `json:"dstPort,omitempty"`
	TCPFlags TCPFlags `json:"tcpFlags,omitempty"`
	CTState  CTState  `json:"ctState"`
	ICMPType uint8    `json:"icmpType,omitempty"`
	ICMPCode uint8    `json:"icmpCode,omitempty"`
	// Len is the packet's length, Ethernet header included.
	Len uint32 `json:"len"`
	// SrcIdentity and DstIdentity are the security identities the
	// datapath found for the addresses in the ipcache; 0 for none.
	SrcIdentity uint32 `json:"srcIdentity,omitempty"`
	DstIdentity uint32 `json:"dstIdentity,omitempty"`
	// Direction is set on policy drops and policy verdicts.
	Direction Direction `json:"direction,omitzero"`
	// PolicyCookie, on policy verdicts, is the cookie of the policy map
	// entry that allowed the connection: it names the policies
	// (pkg/policymap.Cookie); 0 for none (the host's ingress).
	PolicyCookie uint32 `json:"policyCookie,omitempty"`
}

// IsICMP says whether the flow is ICMP or ICMPv6, whose type and code are
// meaningful.
func (f *Flow) IsICMP() bool { return f.Proto == unix.IPPROTO_ICMP || f.Proto == unix.IPPROTO_ICMPV6 }

func (f *Flow) String() string {
	var b strings.Builder
	switch {
	case !f.Src.IsValid():
		// Dropped before its addresses were read.
		fmt.Fprintf(&b, "%s (addresses not read)", f.Proto)
	case f.IsICMP():
		fmt.Fprintf(&b, "%s %s -> %s type %d code %d", f.Proto, f.Src, f.Dst, f.ICMPType, f.ICMPCode)
	case f.SrcPort != 0 || f.DstPort != 0:
		fmt.Fprintf(&b, "%s %s -> %s", f.Proto, netip.AddrPortFrom(f.Src, f.SrcPort), netip.AddrPortFrom(f.Dst, f.DstPort))
	default:
		fmt.Fprintf(&b, "%s %s -> %s", f.Proto, f.Src, f.Dst)
	}
	if f.TCPFlags != 0 {
		fmt.Fprintf(&b, " %s", f.TCPFlags)
	}
	fmt.Fprintf(&b, " ct=%s len=%d", f.CTState, f.Len)
	if f.Direction != DirectionUnknown {
		fmt.Fprintf(&b, " %s", f.Direction)
	}
	return b.String()
}

// TraceEvent: a program passed a packet.
type TraceEvent struct {
	Time time.Time `json:"time"`
	// EndpointID is the endpoint whose program saw the packet, 0 when
	// the program could not tell (an address not in the endpoint map).
	EndpointID uint16 `json:"endpointID"`
	// IfIndex is the interface the program runs on: the endpoint's
	// host-side veth.
	IfIndex uint32     `json:"ifindex"`
	Point   TracePoint `json:"point"`
	Flow    Flow       `json:"flow"`
}

func (*TraceEvent) Kind() string { return KindTrace }

func (e *TraceEvent) String() string {
	return fmt.Sprintf("trace %s endpoint %d ifindex %d: %s", e.Point, e.EndpointID, e.IfIndex, &e.Flow)
}

// DropEvent: a program dropped a packet.
type DropEvent struct {
	Time       time.Time  `json:"time"`
	EndpointID uint16     `json:"endpointID"`
	IfIndex    uint32     `json:"ifindex"`
	Reason     DropReason `json:"reason"`
	Flow       Flow       `json:"flow"`
}

func (*DropEvent) Kind() string { return KindDrop }

func (e *DropEvent) String() string {
	return fmt.Sprintf("drop (%s) endpoint %d ifindex %d: %s", e.Reason, e.EndpointID, e.IfIndex, &e.Flow)
}

// PolicyVerdictEvent: a program let a new connection open in a direction
// where its endpoint is isolated; one per connection and program.
// Flow.Direction is the direction, Match the kind of entry that allowed it.
type PolicyVerdictEvent struct {
	Time       time.Time   `json:"time"`
	EndpointID uint16      `json:"endpointID"`
	IfIndex    uint32      `json:"ifindex"`
	Match      PolicyMatch `json:"match"`
	Flow       Flow        `json:"flow"`
}

func (*PolicyVerdictEvent) Kind() string { return KindPolicy }

func (e *PolicyVerdictEvent) String() string {
	return fmt.Sprintf("policy-verdict allowed (%s) endpoint %d ifindex %d: %s", e.Match, e.EndpointID, e.IfIndex, &e.Flow)
}

// SockLBEvent: a socket program translated an address. For connect and
// sendmsg, Original is the service frontend the application asked for and
// Translated the backend the socket was sent to; for recvmsg and
// getpeername, Original is the backend the kernel knows and Translated the
// frontend the application is shown.
type SockLBEvent struct {
	Time        time.Time      `json:"time"`
	Hook        SockLBHook     `json:"hook"`
	Proto       Proto          `json:"proto"`
	RevNATIndex uint16         `json:"revNATIndex"`
	SockCookie  uint64         `json:"sockCookie"`
	NetnsCookie uint64         `json:"netnsCookie"`
	Original    netip.AddrPort `json:"original"`
	Translated  netip.AddrPort `json:"translated"`
}

func (*SockLBEvent) Kind() string { return KindSockLB }

func (e *SockLBEvent) String() string {
	return fmt.Sprintf("sock-lb %s %s %s -> %s (rev-nat %d, socket %d, netns %d)",
		e.Hook, e.Proto, e.Original, e.Translated, e.RevNATIndex, e.SockCookie, e.NetnsCookie)
}

// Types of agent notifications, AgentEvent.Type.
const (
	AgentStarted    = "agent-started"
	EndpointCreated = "endpoint-created"
	EndpointDeleted = "endpoint-deleted"
	ServiceUpdated  = "service-updated"
	ServiceDeleted  = "service-deleted"
)

// AgentEvent is a notification of the agent's own: it started, an
// endpoint or a service changed.
type AgentEvent struct {
	Type    string    `json:"type"`
	Message string    `json:"message"`
	Time    time.Time `json:"time"`
}

func (*AgentEvent) Kind() string { return KindAgent }

func (e *AgentEvent) String() string { return fmt.Sprintf("agent %s: %s", e.Type, e.Message) }

// BootClock turns CLOCK_BOOTTIME readings, the records' times, into
// wall-clock time.
type BootClock struct {
	// Boot is the wall-clock time at which CLOCK_BOOTTIME was zero.
	Boot time.Time
}

// SystemBootClock reads the boot instant from the system's clocks. Read it
// again after the wall clock is set (NTP steps) to keep times exact.
func SystemBootClock() BootClock {
	var real, boot unix.Timespec
	// Neither call can fail on Linux: valid clock IDs, writable ts.
	_ = unix.ClockGettime(unix.CLOCK_REALTIME, &real)
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot)
	return BootClock{Boot: time.Unix(0, real.Nano()-boot.Nano())}
}

// Time is the wall-clock time of ktime, nanoseconds of CLOCK_BOOTTIME.
func (c BootClock) Time(ktime uint64) time.Time { return c.Boot.Add(time.Duration(ktime)) }

// KTime is the CLOCK_BOOTTIME reading of t, the inverse of Time.
func (c BootClock) KTime(t time.Time) uint64 { return uint64(t.Sub(c.Boot)) }
