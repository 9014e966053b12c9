package monitorapi_test

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cellium/cellium/pkg/monitorapi"
)

var boot = monitorapi.BootClock{Boot: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}

// The records below are written out byte by byte, as the C structs of
// events.h lay them out on a little-endian machine.

var traceRecord = []byte{
	// event_hdr: type 1 (trace), subtype 3 (to-stack), endpoint 0x0102, ifindex 7, ktime 1.5s
	1, 3, 0x02, 0x01, 7, 0, 0, 0, 0x00, 0x2f, 0x68, 0x59, 0, 0, 0, 0,
	// flow_summary: family 4, TCP, SYN|ACK, ct reply, icmp 0/0
	4, 6, 0x12, 3, 0, 0,
	0x9c, 0x40, // sport 40000
	0x00, 0x50, // dport 80
	0, 0, // pad
	74, 0, 0, 0, // len 74
	10, 244, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // saddr
	10, 244, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // daddr
	0x2c, 0x01, 0, 0, // src identity 300
	2, 0, 0, 0, // dst identity 2 (world)
	0, 0, 0, 0, 0, 0, 0, 0, // no direction, pad2
}

var dropRecord = []byte{
	// drop, reason 1 (invalid-packet), endpoint 5, ifindex 9, ktime 0
	2, 1, 5, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	// family 6, ICMPv6 type 128 code 0, id 0x1234 as sport
	6, 58, 0, 1, 128, 0, 0x12, 0x34, 0, 0, 0, 0, 0x40, 0, 0, 0,
	0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
	0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3,
	0, 0, 0, 0, 0, 0, 0, 0, // identities unknown
	0, 0, 0, 0, 0, 0, 0, 0, // no direction, pad2
}

var policyDropRecord = []byte{
	// drop, reason 4 (policy-denied), endpoint 5, ifindex 9, ktime 0
	2, 4, 5, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	// family 4, TCP, SYN, ct new
	4, 6, 0x02, 1, 0, 0,
	0x9c, 0x40, // sport 40000
	0x00, 0x51, // dport 81
	0, 0, 74, 0, 0, 0,
	10, 244, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	10, 244, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0xe8, 0x03, 0, 0, 0xd0, 0x07, 0, 0, // identities 1000, 2000
	1, 0, 0, 0, 0, 0, 0, 0, // direction ingress, pad2
}

var policyVerdictRecord = []byte{
	// policy verdict, match 1 (l3-l4), endpoint 5, ifindex 9, ktime 0
	4, 1, 5, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	4, 6, 0x02, 1, 0, 0,
	0x9c, 0x40, 0x00, 0x50, // 40000 -> 80
	0, 0, 74, 0, 0, 0,
	10, 244, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	10, 244, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0xd0, 0x07, 0, 0, 0xe8, 0x03, 0, 0, // identities 2000, 1000
	2, 0, 0, 0, 0, 0, 0, 0, // direction egress, pad2
}

var sockLBRecord = []byte{
	// sock-lb, hook 1 (connect), no endpoint or ifindex, ktime 2s
	3, 1, 0, 0, 0, 0, 0, 0, 0x00, 0x94, 0x35, 0x77, 0, 0, 0, 0,
	// family 4, UDP, rev_nat_index 7, pad
	4, 17, 7, 0, 0, 0, 0, 0,
	0x11, 0, 0, 0, 0, 0, 0, 0, // sock_cookie 17
	0x01, 0x10, 0, 0, 0, 0, 0, 0, // netns_cookie 0x1001
	10, 96, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // orig_addr
	0, 53, // orig_port 53
	10, 244, 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // xlated_addr
	0x1f, 0x90, // xlated_port 8080
	0, 0, 0, 0, // pad2
}

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		raw  []byte
		want monitorapi.Event
		text string
	}{
		{
			name: "trace",
			raw:  traceRecord,
			want: &monitorapi.TraceEvent{
				Time: boot.Boot.Add(1500 * time.Millisecond), EndpointID: 0x0102, IfIndex: 7, Point: monitorapi.TraceToStack,
				Flow: monitorapi.Flow{
					Src: netip.MustParseAddr("10.244.0.2"), Dst: netip.MustParseAddr("10.244.0.3"), Proto: 6,
					SrcPort: 40000, DstPort: 80, TCPFlags: monitorapi.TCPSyn | monitorapi.TCPAck, CTState: monitorapi.CTReply, Len: 74,
					SrcIdentity: 300, DstIdentity: 2,
				},
			},
			text: "trace to-stack endpoint 258 ifindex 7: TCP 10.244.0.2:40000 -> 10.244.0.3:80 SYN|ACK ct=reply len=74",
		},
		{
			name: "drop",
			raw:  dropRecord,
			want: &monitorapi.DropEvent{
				Time: boot.Boot, EndpointID: 5, IfIndex: 9, Reason: monitorapi.DropInvalidPacket,
				Flow: monitorapi.Flow{
					Src: netip.MustParseAddr("fd00::2"), Dst: netip.MustParseAddr("fd00::3"), Proto: 58,
					SrcPort: 0x1234, CTState: monitorapi.CTNew, ICMPType: 128, Len: 64,
				},
			},
			text: "drop (invalid-packet) endpoint 5 ifindex 9: ICMPv6 fd00::2 -> fd00::3 type 128 code 0 ct=new len=64",
		},
		{
			name: "policy drop",
			raw:  policyDropRecord,
			want: &monitorapi.DropEvent{
				Time: boot.Boot, EndpointID: 5, IfIndex: 9, Reason: monitorapi.DropPolicyDenied,
				Flow: monitorapi.Flow{
					Src: netip.MustParseAddr("10.244.0.9"), Dst: netip.MustParseAddr("10.244.0.3"), Proto: 6,
					SrcPort: 40000, DstPort: 81, TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74,
					SrcIdentity: 1000, DstIdentity: 2000, Direction: monitorapi.DirectionIngress,
				},
			},
			text: "drop (policy-denied) endpoint 5 ifindex 9: TCP 10.244.0.9:40000 -> 10.244.0.3:81 SYN ct=new len=74 ingress",
		},
		{
			name: "policy verdict",
			raw:  policyVerdictRecord,
			want: &monitorapi.PolicyVerdictEvent{
				Time: boot.Boot, EndpointID: 5, IfIndex: 9, Match: monitorapi.PolicyMatchL3L4,
				Flow: monitorapi.Flow{
					Src: netip.MustParseAddr("10.244.0.3"), Dst: netip.MustParseAddr("10.244.0.9"), Proto: 6,
					SrcPort: 40000, DstPort: 80, TCPFlags: monitorapi.TCPSyn, CTState: monitorapi.CTNew, Len: 74,
					SrcIdentity: 2000, DstIdentity: 1000, Direction: monitorapi.DirectionEgress,
				},
			},
			text: "policy-verdict allowed (l3-l4) endpoint 5 ifindex 9: TCP 10.244.0.3:40000 -> 10.244.0.9:80 SYN ct=new len=74 egress",
		},
		{
			name: "sock-lb",
			raw:  sockLBRecord,
			want: &monitorapi.SockLBEvent{
				Time: boot.Boot.Add(2 * time.Second), Hook: monitorapi.SockLBConnect, Proto: 17, RevNATIndex: 7,
				SockCookie: 17, NetnsCookie: 0x1001,
				Original:   netip.MustParseAddrPort("10.96.0.10:53"),
				Translated: netip.MustParseAddrPort("10.244.1.5:8080"),
			},
			text: "sock-lb connect UDP 10.96.0.10:53 -> 10.244.1.5:8080 (rev-nat 7, socket 17, netns 4097)",
		},
		{
			// A newer datapath may append fields.
			name: "longer record",
			raw:  append(append([]byte(nil), traceRecord...), 0xee, 0xee, 0xee, 0xee),
			want: func() monitorapi.Event { ev, _ := monitorapi.Decode(traceRecord, boot); return ev }(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := monitorapi.Decode(tc.raw, boot)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Decode:\n got %+v\nwant %+v", got, tc.want)
			}
			if tc.text != "" {
				if s := got.(interface{ String() string }).String(); s != tc.text {
					t.Fatalf("String:\n got %q\nwant %q", s, tc.text)
				}
			}
			// Encode writes back the same bytes.
			rec, err := monitorapi.Encode(got, boot)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(rec); string(rec) != string(tc.raw[:n]) {
				t.Fatalf("Encode:\n got % x\nwant % x", rec, tc.raw[:n])
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	unknownFamily := append([]byte(nil), traceRecord...)
	unknownFamily[16] = 5
	sockNoFamily := append([]byte(nil), sockLBRecord...)
	sockNoFamily[16] = 0
	unknownType := append([]byte(nil), traceRecord...)
	unknownType[0] = 9
	for _, tc := range []struct {
		name string
		raw  []byte
		want string
	}{
		{"empty", nil, "record of 0 bytes, shorter than the 16-byte header"},
		{"header only", traceRecord[:16], "decode trace event: flow summary of 0 bytes, want 64"},
		{"short drop", dropRecord[:40], "decode drop event: flow summary of 24 bytes, want 64"},
		{"short sock-lb", sockLBRecord[:79], "decode sock-lb event: socket summary of 63 bytes, want 64"},
		{"unknown type", unknownType, "unknown record type 9: want 1 (trace), 2 (drop), 3 (sock-lb) or 4 (policy-verdict)"},
		{"unknown family", unknownFamily, "decode trace event: unknown address family 5: want 4 or 6"},
		{"sock-lb without family", sockNoFamily, "decode sock-lb event: unknown address family 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := monitorapi.Decode(tc.raw, boot)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Decode = %v, %v; want error %q", ev, err, tc.want)
			}
		})
	}
}

// A drop before the addresses were read (an unsupported EtherType) has
// family 0: the event has no addresses.
func TestDecodeDropWithoutAddresses(t *testing.T) {
	rec := make([]byte, monitorapi.HeaderLen+monitorapi.FlowSummaryLen)
	rec[0], rec[1] = monitorapi.RecordDrop, uint8(monitorapi.DropUnsupportedL3)
	ev, err := monitorapi.Decode(rec, boot)
	if err != nil {
		t.Fatal(err)
	}
	d := ev.(*monitorapi.DropEvent)
	if d.Flow.Src.IsValid() || d.Flow.Dst.IsValid() || d.Reason.String() != "unsupported-l3" {
		t.Fatalf("got %+v, want no addresses and reason unsupported-l3", d)
	}
}

func TestEncodeErrors(t *testing.T) {
	for _, ev := range []monitorapi.Event{
		&monitorapi.AgentEvent{Type: monitorapi.AgentStarted},
		&monitorapi.TraceEvent{Flow: monitorapi.Flow{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("fd00::1")}},
		&monitorapi.SockLBEvent{},
	} {
		if rec, err := monitorapi.Encode(ev, boot); err == nil {
			t.Errorf("Encode(%+v) = % x, want an error", ev, rec)
		}
	}
}

func TestJSON(t *testing.T) {
	ev, err := monitorapi.Decode(traceRecord, boot)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time":"2026-01-02T03:04:06.5Z","endpointID":258,"ifindex":7,"point":"to-stack","flow":{"src":"10.244.0.2","dst":"10.244.0.3","proto":"TCP","srcPort":40000,"dstPort":80,"tcpFlags":"SYN|ACK","ctState":"reply","len":74,"srcIdentity":300,"dstIdentity":2}}`
	if string(b) != want {
		t.Fatalf("JSON:\n got %s\nwant %s", b, want)
	}
	var back monitorapi.TraceEvent
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, ev) {
		t.Fatalf("JSON round trip:\n got %+v\nwant %+v", &back, ev)
	}

	drop, _ := monitorapi.Decode(dropRecord, boot)
	b, _ = json.Marshal(drop)
	var d monitorapi.DropEvent
	if err := json.Unmarshal(b, &d); err != nil || !reflect.DeepEqual(&d, drop) || !strings.Contains(string(b), `"reason":"invalid-packet"`) {
		t.Fatalf("drop JSON %s round trip: %+v, %v", b, d, err)
	}
	sock, _ := monitorapi.Decode(sockLBRecord, boot)
	b, _ = json.Marshal(sock)
	var s monitorapi.SockLBEvent
	if err := json.Unmarshal(b, &s); err != nil || !reflect.DeepEqual(&s, sock) || !strings.Contains(string(b), `"hook":"connect"`) {
		t.Fatalf("sock-lb JSON %s round trip: %+v, %v", b, s, err)
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{monitorapi.DropReasonName(1), "invalid-packet"},
		{monitorapi.DropReasonName(2), "unsupported-l3"},
		{monitorapi.DropReasonName(3), "ct-create-failed"},
		{monitorapi.DropReasonName(4), "policy-denied"},
		{monitorapi.DropReasonName(5), "invalid-source"},
		{monitorapi.DropReasonName(200), "reason-200"},
		{monitorapi.TraceFromEndpoint.String(), "from-endpoint"},
		{monitorapi.TraceToEndpoint.String(), "to-endpoint"},
		{monitorapi.TraceToStack.String(), "to-stack"},
		{monitorapi.SockLBGetpeername.String(), "getpeername"},
		{monitorapi.CTRelated.String(), "related"},
		{monitorapi.TCPFlags(0x3f).String(), "FIN|SYN|RST|PSH|ACK|URG"},
		{monitorapi.Proto(58).String(), "ICMPv6"},
		{monitorapi.Proto(47).String(), "proto-47"},
		{(&monitorapi.TraceEvent{}).Kind(), "trace"},
		{(&monitorapi.DropEvent{}).Kind(), "drop"},
		{(&monitorapi.SockLBEvent{}).Kind(), "sock-lb"},
		{(&monitorapi.AgentEvent{}).Kind(), "agent"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	var r monitorapi.DropReason
	if err := r.UnmarshalText([]byte("reason-200")); err != nil || r != 200 {
		t.Fatalf("unknown reason does not round-trip: %d, %v", r, err)
	}
}

func TestSystemBootClock(t *testing.T) {
	c := monitorapi.SystemBootClock()
	if c.Boot.After(time.Now()) || time.Since(c.Boot) > 10*365*24*time.Hour {
		t.Fatalf("boot instant %v is not in the past", c.Boot)
	}
	now := time.Now()
	if d := c.Time(c.KTime(now)).Sub(now); d != 0 {
		t.Fatalf("KTime and Time are not inverse: off by %v", d)
	}
}
