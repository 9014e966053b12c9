package monitorapi_test

import (
	"encoding/binary"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/cellium/cellium/bpf"
	"github.com/cellium/cellium/pkg/monitorapi"
)

// The record structs of bpf/include/events.h, as the compiled programs'
// BTF describes them, against this package's encoder: every C field must
// hold, at its offset, the bytes Encode writes for the field of that name.
// That checks the sizes and offsets of both sides, and the byte order of
// each field, in one go.

func le16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }
func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func addr16(s string) []byte {
	a := netip.MustParseAddr(s)
	if a.Is4() {
		b := a.As4()
		return append(b[:], make([]byte, 12)...)
	}
	b := a.As16()
	return b[:]
}

// recordType is the struct named name in the BTF of an object.
func recordType(t *testing.T, load func() (*ebpf.CollectionSpec, error), name string) *btf.Struct {
	t.Helper()
	spec, err := load()
	if err != nil {
		t.Fatal(err)
	}
	var st *btf.Struct
	if err := spec.Types.TypeByName(name, &st); err != nil {
		t.Fatalf("struct %s: %v", name, err)
	}
	return st
}

// checkFields compares each field of st, at base in rec, with want, by
// name; st and want must name the same fields.
func checkFields(t *testing.T, st *btf.Struct, rec []byte, base int, want map[string][]byte) {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range st.Members {
		size, err := btf.Sizeof(m.Type)
		if err != nil {
			t.Fatalf("%s.%s: %v", st.Name, m.Name, err)
		}
		w, ok := want[m.Name]
		if !ok {
			t.Errorf("%s.%s: a field the Go side does not know", st.Name, m.Name)
			continue
		}
		seen[m.Name] = true
		off := base + int(m.Offset.Bytes())
		if len(w) != size || off+size > len(rec) {
			t.Errorf("%s.%s: %d bytes at %d in C, %d in Go", st.Name, m.Name, size, m.Offset.Bytes(), len(w))
			continue
		}
		if got := rec[off : off+size]; string(got) != string(w) {
			t.Errorf("%s.%s at %d: Encode wrote % x, want % x", st.Name, m.Name, m.Offset.Bytes(), got, w)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s has no field %s", st.Name, name)
		}
	}
}

// checkRecord checks that record is a header followed by a body of
// bodyLen bytes, and returns the two structs.
func checkRecord(t *testing.T, record *btf.Struct, bodyLen int) (hdr, body *btf.Struct) {
	t.Helper()
	if int(record.Size) != monitorapi.HeaderLen+bodyLen || len(record.Members) != 2 {
		t.Fatalf("struct %s: %d bytes in %d fields, want a %d-byte header and a %d-byte body",
			record.Name, record.Size, len(record.Members), monitorapi.HeaderLen, bodyLen)
	}
	hdr, ok1 := btf.UnderlyingType(record.Members[0].Type).(*btf.Struct)
	body, ok2 := btf.UnderlyingType(record.Members[1].Type).(*btf.Struct)
	if !ok1 || !ok2 || record.Members[0].Offset != 0 || int(record.Members[1].Offset.Bytes()) != monitorapi.HeaderLen {
		t.Fatalf("struct %s: %v, want the header at 0 and the body at %d", record.Name, record.Members, monitorapi.HeaderLen)
	}
	if int(hdr.Size) != monitorapi.HeaderLen || int(body.Size) != bodyLen {
		t.Fatalf("struct %s: header %d bytes, body %d; want %d and %d", record.Name, hdr.Size, body.Size, monitorapi.HeaderLen, bodyLen)
	}
	return hdr, body
}

var layoutBoot = monitorapi.BootClock{Boot: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}

func TestFlowRecordMatchesBTF(t *testing.T) {
	hdr, body := checkRecord(t, recordType(t, bpf.LoadLXC, "flow_record"), monitorapi.FlowSummaryLen)
	ev := &monitorapi.DropEvent{
		Time:       layoutBoot.Boot.Add(1500 * time.Millisecond),
		EndpointID: 0x0102,
		IfIndex:    0x03040506,
		Reason:     monitorapi.DropCTCreateFailed,
		Flow: monitorapi.Flow{
			Src: netip.MustParseAddr("fd00::2"), Dst: netip.MustParseAddr("fd00::3"),
			Proto: 6, SrcPort: 40000, DstPort: 80, TCPFlags: 0x12, CTState: 3,
			ICMPType: 9, ICMPCode: 10, Len: 0x11223344, SrcIdentity: 0x01000001, DstIdentity: 0x0102,
			Direction: monitorapi.DirectionEgress, PolicyCookie: 0x0a0b0c0d,
		},
	}
	rec, err := monitorapi.Encode(ev, layoutBoot)
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, hdr, rec, 0, map[string][]byte{
		"type": {monitorapi.RecordDrop}, "subtype": {uint8(monitorapi.DropCTCreateFailed)},
		"endpoint_id": le16(0x0102), "ifindex": le32(0x03040506), "ktime": le64(1_500_000_000),
	})
	checkFields(t, body, rec, monitorapi.HeaderLen, map[string][]byte{
		"family": {6}, "proto": {6}, "tcp_flags": {0x12}, "ct_state": {3}, "icmp_type": {9}, "icmp_code": {10},
		"sport": be16(40000), "dport": be16(80), "pad": {0, 0}, "len": le32(0x11223344),
		"src": addr16("fd00::2"), "dst": addr16("fd00::3"),
		"src_identity": le32(0x01000001), "dst_identity": le32(0x0102),
		"direction": {uint8(monitorapi.DirectionEgress)}, "pad2": make([]byte, 3), "policy_cookie": le32(0x0a0b0c0d),
	})
}

func TestSockLBRecordMatchesBTF(t *testing.T) {
	_, body := checkRecord(t, recordType(t, bpf.LoadSockLB, "sock_lb_record"), monitorapi.SockLBSummaryLen)
	ev := &monitorapi.SockLBEvent{
		Time:        layoutBoot.Boot.Add(2 * time.Second),
		Hook:        monitorapi.SockLBRecvmsg,
		Proto:       17,
		RevNATIndex: 0x0708,
		SockCookie:  0x1112131415161718,
		NetnsCookie: 0x2122232425262728,
		Original:    netip.MustParseAddrPort("10.244.1.5:8080"),
		Translated:  netip.MustParseAddrPort("10.96.0.10:53"),
	}
	rec, err := monitorapi.Encode(ev, layoutBoot)
	if err != nil {
		t.Fatal(err)
	}
	checkFields(t, body, rec, monitorapi.HeaderLen, map[string][]byte{
		"family": {4}, "proto": {17}, "rev_nat_index": le16(0x0708), "pad": make([]byte, 4),
		"sock_cookie": le64(0x1112131415161718), "netns_cookie": le64(0x2122232425262728),
		"orig_addr": addr16("10.244.1.5"), "orig_port": be16(8080),
		"xlated_addr": addr16("10.96.0.10"), "xlated_port": be16(53), "pad2": make([]byte, 4),
	})
}

// TestConstantsMatchC compares the codes of the records with events.h's
// #defines, which BTF does not carry.
func TestConstantsMatchC(t *testing.T) {
	src, err := os.ReadFile("../../bpf/include/events.h")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint8{}
	for _, m := range regexp.MustCompile(`(?m)^#define ((?:EVENT|TRACE|DROP|CT|SOCK_LB_HOOK|POLICY_MATCH|TRAFFIC)_\w+) (\d+)`).FindAllSubmatch(src, -1) {
		v, err := strconv.ParseUint(string(m[2]), 10, 8)
		if err != nil {
			t.Fatal(err)
		}
		defines[string(m[1])] = uint8(v)
	}
	want := map[string]uint8{
		"EVENT_TRACE":              monitorapi.RecordTrace,
		"EVENT_DROP":               monitorapi.RecordDrop,
		"EVENT_SOCK_LB":            monitorapi.RecordSockLB,
		"EVENT_POLICY_VERDICT":     monitorapi.RecordPolicyVerdict,
		"DROP_POLICY_DENIED":       uint8(monitorapi.DropPolicyDenied),
		"POLICY_MATCH_L3_L4":       uint8(monitorapi.PolicyMatchL3L4),
		"POLICY_MATCH_L3_ONLY":     uint8(monitorapi.PolicyMatchL3Only),
		"POLICY_MATCH_L4_ONLY":     uint8(monitorapi.PolicyMatchL4Only),
		"POLICY_MATCH_ALL":         uint8(monitorapi.PolicyMatchAll),
		"POLICY_MATCH_HOST":        uint8(monitorapi.PolicyMatchHost),
		"TRAFFIC_INGRESS":          uint8(monitorapi.DirectionIngress),
		"TRAFFIC_EGRESS":           uint8(monitorapi.DirectionEgress),
		"EVENT_FAMILY_NONE":        0,
		"EVENT_FAMILY_IPV4":        4,
		"EVENT_FAMILY_IPV6":        6,
		"TRACE_FROM_ENDPOINT":      uint8(monitorapi.TraceFromEndpoint),
		"TRACE_TO_ENDPOINT":        uint8(monitorapi.TraceToEndpoint),
		"TRACE_TO_STACK":           uint8(monitorapi.TraceToStack),
		"DROP_INVALID_PACKET":      uint8(monitorapi.DropInvalidPacket),
		"DROP_UNSUPPORTED_L3":      uint8(monitorapi.DropUnsupportedL3),
		"DROP_CT_CREATE_FAILED":    uint8(monitorapi.DropCTCreateFailed),
		"DROP_INVALID_SOURCE":      uint8(monitorapi.DropInvalidSource),
		"CT_UNKNOWN":               uint8(monitorapi.CTUnknown),
		"CT_NEW":                   uint8(monitorapi.CTNew),
		"CT_ESTABLISHED":           uint8(monitorapi.CTEstablished),
		"CT_REPLY":                 uint8(monitorapi.CTReply),
		"CT_RELATED":               uint8(monitorapi.CTRelated),
		"SOCK_LB_HOOK_CONNECT":     uint8(monitorapi.SockLBConnect),
		"SOCK_LB_HOOK_SENDMSG":     uint8(monitorapi.SockLBSendmsg),
		"SOCK_LB_HOOK_RECVMSG":     uint8(monitorapi.SockLBRecvmsg),
		"SOCK_LB_HOOK_GETPEERNAME": uint8(monitorapi.SockLBGetpeername),
	}
	if len(defines) != len(want) {
		t.Errorf("events.h defines %v, Go knows %v", defines, want)
	}
	for name, v := range want {
		if got, ok := defines[name]; !ok || got != v {
			t.Errorf("%s is %d (defined %v) in events.h, %d in Go", name, got, ok, v)
		}
	}
}
