package hubble

import (
	"strings"
	"testing"

	"github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Flows the filter tests match against.
var (
	// webToDB: a TCP SYN from default/web-1 to db/postgres-0:5432, forwarded.
	webToDB = &flow.Flow{
		Time:    timestamppb.New(epoch),
		Verdict: flow.Verdict_FORWARDED,
		IP:      &flow.IP{Source: "10.244.0.5", Destination: "10.244.0.9", IpVersion: flow.IPVersion_IPv4},
		L4:      &flow.Layer4{Protocol: &flow.Layer4_TCP{TCP: &flow.TCP{SourcePort: 40000, DestinationPort: 5432, Flags: &flow.TCPFlags{SYN: true}}}},
		Source:  &flow.Endpoint{ID: 1, Identity: 300, Namespace: "default", PodName: "web-1", Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default", "k8s:tier=front"}},
		Destination: &flow.Endpoint{ID: 2, Identity: 301, Namespace: "db", PodName: "postgres-0",
			Labels: []string{"k8s:app=postgres", "k8s:io.kubernetes.pod.namespace=db"}},
		DestinationService: &flow.Service{Namespace: "db", Name: "postgres"},
		NodeName:           "node-1",
		EventType:          &flow.CiliumEventType{Type: 4, SubType: 5},
		TrafficDirection:   flow.TrafficDirection_EGRESS,
		IsReply:            wrapperspb.Bool(false),
		Interface:          &flow.NetworkInterface{Index: 7, Name: "lxc1234"},
	}
	// dnsDrop: a UDP packet from default/web-1 to 10.96.0.10:53, dropped.
	dnsDrop = &flow.Flow{
		Time:           timestamppb.New(epoch),
		Verdict:        flow.Verdict_DROPPED,
		DropReasonDesc: flow.DropReason_CT_MAP_INSERTION_FAILED,
		IP:             &flow.IP{Source: "10.244.0.5", Destination: "10.96.0.10", IpVersion: flow.IPVersion_IPv4},
		L4:             &flow.Layer4{Protocol: &flow.Layer4_UDP{UDP: &flow.UDP{SourcePort: 33000, DestinationPort: 53}}},
		Source:         &flow.Endpoint{ID: 1, Identity: 300, Namespace: "default", PodName: "web-1", Labels: []string{"k8s:app=web", "k8s:io.kubernetes.pod.namespace=default", "k8s:tier=front"}},
		NodeName:       "node-1",
		EventType:      &flow.CiliumEventType{Type: 1, SubType: 155},
	}
	// ping6: an ICMPv6 echo from a host address, no endpoint known.
	ping6 = &flow.Flow{
		Time:     timestamppb.New(epoch),
		Verdict:  flow.Verdict_FORWARDED,
		IP:       &flow.IP{Source: "fd00::1", Destination: "fd00::2", IpVersion: flow.IPVersion_IPv6},
		L4:       &flow.Layer4{Protocol: &flow.Layer4_ICMPv6{ICMPv6: &flow.ICMPv6{Type: 128}}},
		NodeName: "node-2",
	}
)

func TestFilters(t *testing.T) {
	all := []*flow.Flow{webToDB, dnsDrop, ping6}
	names := map[*flow.Flow]string{webToDB: "webToDB", dnsDrop: "dnsDrop", ping6: "ping6"}
	tests := []struct {
		name        string
		allow, deny []*flow.FlowFilter
		want        []*flow.Flow
	}{
		{"no filters", nil, nil, all},
		{"source IP", []*flow.FlowFilter{{SourceIp: []string{"10.244.0.5"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"destination CIDR", []*flow.FlowFilter{{DestinationIp: []string{"10.96.0.0/12"}}}, nil, []*flow.Flow{dnsDrop}},
		{"IPv6 address", []*flow.FlowFilter{{DestinationIp: []string{"fd00::2"}}}, nil, []*flow.Flow{ping6}},
		{"source pod prefix", []*flow.FlowFilter{{SourcePod: []string{"default/web"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"pod without namespace is in default", []*flow.FlowFilter{{SourcePod: []string{"web-1"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"pod in another namespace", []*flow.FlowFilter{{SourcePod: []string{"db/web"}}}, nil, nil},
		{"pod in any namespace", []*flow.FlowFilter{{DestinationPod: []string{"/postgres"}}}, nil, []*flow.Flow{webToDB}},
		{"any pod, as --all-namespaces sends", []*flow.FlowFilter{{SourcePod: []string{"/"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"namespace: either side", []*flow.FlowFilter{{SourcePod: []string{"db/"}}, {DestinationPod: []string{"db/"}}}, nil, []*flow.Flow{webToDB}},
		{"verdict", []*flow.FlowFilter{{Verdict: []flow.Verdict{flow.Verdict_DROPPED}}}, nil, []*flow.Flow{dnsDrop}},
		{"drop reason", []*flow.FlowFilter{{DropReasonDesc: []flow.DropReason{flow.DropReason_CT_MAP_INSERTION_FAILED}}}, nil, []*flow.Flow{dnsDrop}},
		{"protocol tcp", []*flow.FlowFilter{{Protocol: []string{"tcp"}}}, nil, []*flow.Flow{webToDB}},
		{"protocol icmp is either ICMP", []*flow.FlowFilter{{Protocol: []string{"ICMP"}}}, nil, []*flow.Flow{ping6}},
		{"protocol list", []*flow.FlowFilter{{Protocol: []string{"udp", "icmpv6"}}}, nil, []*flow.Flow{dnsDrop, ping6}},
		{"destination port", []*flow.FlowFilter{{DestinationPort: []string{"53"}}}, nil, []*flow.Flow{dnsDrop}},
		{"source port", []*flow.FlowFilter{{SourcePort: []string{"40000"}}}, nil, []*flow.Flow{webToDB}},
		{"fields of one filter all hold", []*flow.FlowFilter{{SourcePod: []string{"default/"}, Protocol: []string{"udp"}}}, nil, []*flow.Flow{dnsDrop}},
		{"filters of a list: any holds", []*flow.FlowFilter{{Protocol: []string{"tcp"}}, {NodeName: []string{"node-2"}}}, nil, []*flow.Flow{webToDB, ping6}},
		{"blacklist only", nil, []*flow.FlowFilter{{Verdict: []flow.Verdict{flow.Verdict_DROPPED}}}, []*flow.Flow{webToDB, ping6}},
		{"whitelist minus blacklist", []*flow.FlowFilter{{SourceIp: []string{"10.244.0.0/16"}}}, []*flow.FlowFilter{{Protocol: []string{"udp"}}}, []*flow.Flow{webToDB}},
		{"source label", []*flow.FlowFilter{{SourceLabel: []string{"k8s:app=web"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"source identity", []*flow.FlowFilter{{SourceIdentity: []uint32{301, 300}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"destination identity", []*flow.FlowFilter{{DestinationIdentity: []uint32{301}}}, nil, []*flow.Flow{webToDB}},
		{"identity no flow has", []*flow.FlowFilter{{SourceIdentity: []uint32{2}}}, nil, nil},
		{"label without source: any source", []*flow.FlowFilter{{SourceLabel: []string{"app=web"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"label of another source", []*flow.FlowFilter{{SourceLabel: []string{"reserved:app=web"}}}, nil, nil},
		{"namespace label", []*flow.FlowFilter{{DestinationLabel: []string{"io.kubernetes.pod.namespace=db"}}}, nil, []*flow.Flow{webToDB}},
		{"label terms all hold", []*flow.FlowFilter{{SourceLabel: []string{"app=web,tier!=front"}}}, nil, nil},
		{"label exists and not", []*flow.FlowFilter{{DestinationLabel: []string{"app,!tier"}}}, nil, []*flow.Flow{webToDB}},
		{"label in a set", []*flow.FlowFilter{{SourceLabel: []string{"k8s:app in (web, api)"}}}, nil, []*flow.Flow{webToDB, dnsDrop}},
		{"label in a set, then another term", []*flow.FlowFilter{{SourceLabel: []string{"app in (db, api),!tier"}}}, nil, nil},
		{"label not in a set", []*flow.FlowFilter{{DestinationLabel: []string{"k8s:app notin (web)"}}}, nil, []*flow.Flow{webToDB, dnsDrop, ping6}},
		{"destination service", []*flow.FlowFilter{{DestinationService: []string{"db/post"}}}, nil, []*flow.Flow{webToDB}},
		{"event type and subtype", []*flow.FlowFilter{{EventType: []*flow.EventTypeFilter{{Type: 4, MatchSubType: true, SubType: 5}}}}, nil, []*flow.Flow{webToDB}},
		{"event type, any subtype", []*flow.FlowFilter{{EventType: []*flow.EventTypeFilter{{Type: 1}}}}, nil, []*flow.Flow{dnsDrop}},
		{"ip version", []*flow.FlowFilter{{IpVersion: []flow.IPVersion{flow.IPVersion_IPv6}}}, nil, []*flow.Flow{ping6}},
		{"traffic direction", []*flow.FlowFilter{{TrafficDirection: []flow.TrafficDirection{flow.TrafficDirection_EGRESS}}}, nil, []*flow.Flow{webToDB}},
		{"reply: only flows known not to be", []*flow.FlowFilter{{Reply: []bool{false}}}, nil, []*flow.Flow{webToDB}},
		{"tcp flags", []*flow.FlowFilter{{TcpFlags: []*flow.TCPFlags{{SYN: true}}}}, nil, []*flow.Flow{webToDB}},
		{"tcp flags not set", []*flow.FlowFilter{{TcpFlags: []*flow.TCPFlags{{SYN: true, ACK: true}}}}, nil, nil},
		{"node name pattern", []*flow.FlowFilter{{NodeName: []string{"node-*"}}}, nil, all},
		{"interface by name", []*flow.FlowFilter{{Interface: []*flow.NetworkInterface{{Name: "lxc1234"}}}}, nil, []*flow.Flow{webToDB}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := newFlowMatcher(tc.allow, tc.deny)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range all {
				if m.match(f) {
					got = append(got, names[f])
				}
			}
			var want []string
			for _, f := range tc.want {
				want = append(want, names[f])
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Fatalf("matched %v, want %v", got, want)
			}
		})
	}
}

func TestInvalidFilters(t *testing.T) {
	tests := []struct {
		name   string
		filter *flow.FlowFilter
		want   string
	}{
		{"bad IP", &flow.FlowFilter{SourceIp: []string{"10.244.0.300"}}, `invalid source_ip "10.244.0.300": want an address such as 10.244.0.5 or a CIDR`},
		{"bad port", &flow.FlowFilter{DestinationPort: []string{"http"}}, `invalid destination_port "http": want a port number 0-65535`},
		{"bad protocol", &flow.FlowFilter{Protocol: []string{"gopher"}}, `invalid protocol "gopher": want tcp, udp, sctp, icmp, icmpv4 or icmpv6`},
		{"bad pod", &flow.FlowFilter{SourcePod: []string{"default/web/1"}}, `invalid source_pod "default/web/1"`},
		{"empty pod", &flow.FlowFilter{DestinationPod: []string{""}}, `invalid destination_pod ""`},
		{"bad label", &flow.FlowFilter{SourceLabel: []string{"=web"}}, `invalid source_label "=web": found '=', expected: !, identifier, or 'end of string'`},
		{"bad node pattern", &flow.FlowFilter{NodeName: []string{"node-["}}, `invalid node_name "node-["`},
		{"field this server cannot evaluate", &flow.FlowFilter{SourceFqdn: []string{"example.com"}},
			"whitelist[0]: filter field source_fqdn is not supported by this server (supported: destination_identity, destination_ip, "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newFlowMatcher([]*flow.FlowFilter{tc.filter}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("compile = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	_, err := newFlowMatcher(nil, []*flow.FlowFilter{{}, {DestinationIp: []string{"x"}}})
	if err == nil || !strings.HasPrefix(err.Error(), "blacklist[1]: ") {
		t.Fatalf("bad blacklist filter: %v, want an error naming blacklist[1]", err)
	}
}

func TestLabelSelectorKeys(t *testing.T) {
	for in, want := range map[string]string{
		"k8s:app=web":                        "k8s.app=web",
		"app=web, !tier":                     "any.app=web, !any.tier",
		"k8s:app in (web, db),env!=prod":     "k8s.app in (web, db),any.env!=prod",
		"app.kubernetes.io/name notin (x,y)": "any.app.kubernetes.io/name notin (x,y)",
		"k8s:io.kubernetes.pod.namespace":    "k8s.io.kubernetes.pod.namespace",
	} {
		if got := sourcedKeys(in); got != want {
			t.Errorf("sourcedKeys(%q) = %q, want %q", in, got, want)
		}
	}
}
