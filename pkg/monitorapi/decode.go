package monitorapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Address families of the records' summaries.
const (
	familyNone = 0
	familyIPv4 = 4
	familyIPv6 = 6
)

var le = binary.LittleEndian

// Decode decodes one record of the ring buffer. Times become wall-clock
// time through boot.
func Decode(raw []byte, boot BootClock) (Event, error) {
	if len(raw) < HeaderLen {
		return nil, fmt.Errorf("decode event: record of %d bytes, shorter than the %d-byte header", len(raw), HeaderLen)
	}
	typ, sub := raw[0], raw[1]
	endpoint := le.Uint16(raw[2:])
	ifindex := le.Uint32(raw[4:])
	t := boot.Time(le.Uint64(raw[8:]))
	body := raw[HeaderLen:]
	switch typ {
	case RecordTrace:
		ev := &TraceEvent{Time: t, EndpointID: endpoint, IfIndex: ifindex, Point: TracePoint(sub)}
		return withFlow(ev, &ev.Flow, body)
	case RecordDrop:
		ev := &DropEvent{Time: t, EndpointID: endpoint, IfIndex: ifindex, Reason: DropReason(sub)}
		return withFlow(ev, &ev.Flow, body)
	case RecordPolicyVerdict:
		ev := &PolicyVerdictEvent{Time: t, EndpointID: endpoint, IfIndex: ifindex, Match: PolicyMatch(sub)}
		return withFlow(ev, &ev.Flow, body)
	case RecordSockLB:
		ev, err := decodeSockLB(body)
		if err != nil {
			return nil, fmt.Errorf("decode sock-lb event: %w", err)
		}
		ev.Time, ev.Hook = t, SockLBHook(sub)
		return ev, nil
	}
	return nil, fmt.Errorf("decode event: unknown record type %d: want %d (trace), %d (drop), %d (sock-lb) or %d (policy-verdict)",
		typ, RecordTrace, RecordDrop, RecordSockLB, RecordPolicyVerdict)
}

// withFlow decodes body, the flow summary of a trace, drop or
// policy-verdict record, into flow, ev's Flow.
func withFlow(ev Event, flow *Flow, body []byte) (Event, error) {
	var err error
	if *flow, err = decodeFlow(body); err != nil {
		return nil, fmt.Errorf("decode %s event: %w", ev.Kind(), err)
	}
	return ev, nil
}

func addrOf(family uint8, b []byte) (netip.Addr, error) {
	switch family {
	case familyNone:
		return netip.Addr{}, nil
	case familyIPv4:
		return netip.AddrFrom4([4]byte(b[:4])), nil
	case familyIPv6:
		return netip.AddrFrom16([16]byte(b[:16])), nil
	}
	return netip.Addr{}, fmt.Errorf("unknown address family %d: want 4 or 6", family)
}

func decodeFlow(b []byte) (Flow, error) {
	if len(b) < FlowSummaryLen {
		return Flow{}, fmt.Errorf("flow summary of %d bytes, want %d", len(b), FlowSummaryLen)
	}
	f := Flow{
		Proto:    Proto(b[1]),
		TCPFlags: TCPFlags(b[2]),
		CTState:  CTState(b[3]),
		ICMPType: b[4],
		ICMPCode: b[5],
		SrcPort:  binary.BigEndian.Uint16(b[6:]),
		DstPort:  binary.BigEndian.Uint16(b[8:]),
		Len:      le.Uint32(b[12:]),

		SrcIdentity: le.Uint32(b[48:]),
		DstIdentity: le.Uint32(b[52:]),
		Direction:   Direction(b[56]),

		PolicyCookie: le.Uint32(b[60:]),
	}
	var err error
	if f.Src, err = addrOf(b[0], b[16:32]); err != nil {
		return Flow{}, err
	}
	f.Dst, _ = addrOf(b[0], b[32:48])
	return f, nil
}

func decodeSockLB(b []byte) (*SockLBEvent, error) {
	if len(b) < SockLBSummaryLen {
		return nil, fmt.Errorf("socket summary of %d bytes, want %d", len(b), SockLBSummaryLen)
	}
	family := b[0]
	if family != familyIPv4 && family != familyIPv6 {
		return nil, fmt.Errorf("unknown address family %d: want 4 or 6", family)
	}
	orig, _ := addrOf(family, b[24:40])
	xlated, _ := addrOf(family, b[42:58])
	return &SockLBEvent{
		Proto:       Proto(b[1]),
		RevNATIndex: le.Uint16(b[2:]),
		SockCookie:  le.Uint64(b[8:]),
		NetnsCookie: le.Uint64(b[16:]),
		Original:    netip.AddrPortFrom(orig, binary.BigEndian.Uint16(b[40:])),
		Translated:  netip.AddrPortFrom(xlated, binary.BigEndian.Uint16(b[58:])),
	}, nil
}

// Encode is the record a program writes for ev, the inverse of Decode:
// tests and benchmarks feed it to the ring buffer (cells/monitor/monitortest)
// to drive the monitor without traffic. An AgentEvent has no record.
func Encode(ev Event, boot BootClock) ([]byte, error) {
	switch ev := ev.(type) {
	case *TraceEvent:
		rec := header(RecordTrace, uint8(ev.Point), ev.EndpointID, ev.IfIndex, boot.KTime(ev.Time), FlowSummaryLen)
		return rec, encodeFlow(rec[HeaderLen:], &ev.Flow)
	case *DropEvent:
		rec := header(RecordDrop, uint8(ev.Reason), ev.EndpointID, ev.IfIndex, boot.KTime(ev.Time), FlowSummaryLen)
		return rec, encodeFlow(rec[HeaderLen:], &ev.Flow)
	case *PolicyVerdictEvent:
		rec := header(RecordPolicyVerdict, uint8(ev.Match), ev.EndpointID, ev.IfIndex, boot.KTime(ev.Time), FlowSummaryLen)
		return rec, encodeFlow(rec[HeaderLen:], &ev.Flow)
	case *SockLBEvent:
		rec := header(RecordSockLB, uint8(ev.Hook), 0, 0, boot.KTime(ev.Time), SockLBSummaryLen)
		return rec, encodeSockLB(rec[HeaderLen:], ev)
	}
	return nil, fmt.Errorf("encode event: a %T has no datapath record", ev)
}

func header(typ, sub uint8, endpoint uint16, ifindex uint32, ktime uint64, bodyLen int) []byte {
	rec := make([]byte, HeaderLen+bodyLen)
	rec[0], rec[1] = typ, sub
	le.PutUint16(rec[2:], endpoint)
	le.PutUint32(rec[4:], ifindex)
	le.PutUint64(rec[8:], ktime)
	return rec
}

// putAddr writes addr into b and returns its family.
func putAddr(b []byte, addr netip.Addr) uint8 {
	switch {
	case !addr.IsValid():
		return familyNone
	case addr.Is4():
		a := addr.As4()
		copy(b, a[:])
		return familyIPv4
	}
	a := addr.As16()
	copy(b, a[:])
	return familyIPv6
}

func encodeFlow(b []byte, f *Flow) error {
	family := putAddr(b[16:32], f.Src)
	if putAddr(b[32:48], f.Dst) != family {
		return errors.New("encode event: the flow's source and destination are not of one family")
	}
	b[0], b[1], b[2], b[3], b[4], b[5] = family, uint8(f.Proto), uint8(f.TCPFlags), uint8(f.CTState), f.ICMPType, f.ICMPCode
	binary.BigEndian.PutUint16(b[6:], f.SrcPort)
	binary.BigEndian.PutUint16(b[8:], f.DstPort)
	le.PutUint32(b[12:], f.Len)
	le.PutUint32(b[48:], f.SrcIdentity)
	le.PutUint32(b[52:], f.DstIdentity)
	b[56] = uint8(f.Direction)
	le.PutUint32(b[60:], f.PolicyCookie)
	return nil
}

func encodeSockLB(b []byte, ev *SockLBEvent) error {
	family := putAddr(b[24:40], ev.Original.Addr())
	if family == familyNone || putAddr(b[42:58], ev.Translated.Addr()) != family {
		return errors.New("encode event: the original and translated addresses must be valid and of one family")
	}
	b[0], b[1] = family, uint8(ev.Proto)
	le.PutUint16(b[2:], ev.RevNATIndex)
	le.PutUint64(b[8:], ev.SockCookie)
	le.PutUint64(b[16:], ev.NetnsCookie)
	binary.BigEndian.PutUint16(b[40:], ev.Original.Port())
	binary.BigEndian.PutUint16(b[58:], ev.Translated.Port())
	return nil
}
