package hubble

import (
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/cilium/api/v1/flow"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/apimachinery/pkg/labels"
)

// flowPredicate is one condition of a FlowFilter.
type flowPredicate func(*flow.Flow) bool

// flowMatcher decides whether a flow passes a request's allow list
// (whitelist) and deny list (blacklist). A flow passes when the allow list
// is empty or one of its filters matches, and none of the deny list's
// filters matches. A filter matches when every field it sets matches; a
// field with several values matches when any of them does.
type flowMatcher struct {
	allow, deny [][]flowPredicate
}

// newFlowMatcher compiles the filters of a GetFlows request. A filter that
// sets a field this server cannot evaluate, or a value that does not parse,
// is an error naming it: a filter silently ignored would show flows the
// user asked not to see.
func newFlowMatcher(allow, deny []*flow.FlowFilter) (*flowMatcher, error) {
	m := &flowMatcher{}
	for _, list := range []struct {
		name    string
		filters []*flow.FlowFilter
		out     *[][]flowPredicate
	}{{"whitelist", allow, &m.allow}, {"blacklist", deny, &m.deny}} {
		for i, f := range list.filters {
			preds, err := compileFilter(f)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", list.name, i, err)
			}
			*list.out = append(*list.out, preds)
		}
	}
	return m, nil
}

func (m *flowMatcher) match(f *flow.Flow) bool {
	if len(m.allow) > 0 && !slices.ContainsFunc(m.allow, func(p []flowPredicate) bool { return matchAll(p, f) }) {
		return false
	}
	return !slices.ContainsFunc(m.deny, func(p []flowPredicate) bool { return matchAll(p, f) })
}

func matchAll(preds []flowPredicate, f *flow.Flow) bool {
	for _, p := range preds {
		if !p(f) {
			return false
		}
	}
	return true
}

// filterFields are the FlowFilter fields this server evaluates, by their
// protobuf names, with the compiler of each.
var filterFields = map[protoreflect.Name]func(*flow.FlowFilter) (flowPredicate, error){
	"source_ip": func(ff *flow.FlowFilter) (flowPredicate, error) { return ipFilter("source_ip", ff.SourceIp, sourceIP) },
	"destination_ip": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return ipFilter("destination_ip", ff.DestinationIp, destinationIP)
	},
	"source_pod": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return nameFilter("source_pod", ff.SourcePod, sourcePod)
	},
	"destination_pod": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return nameFilter("destination_pod", ff.DestinationPod, destinationPod)
	},
	"source_service": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return nameFilter("source_service", ff.SourceService, sourceService)
	},
	"destination_service": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return nameFilter("destination_service", ff.DestinationService, destinationService)
	},
	"source_label": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return labelFilter("source_label", ff.SourceLabel, (*flow.Flow).GetSource)
	},
	"destination_label": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return labelFilter("destination_label", ff.DestinationLabel, (*flow.Flow).GetDestination)
	},
	"source_identity": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return identityFilter(ff.SourceIdentity, (*flow.Flow).GetSource), nil
	},
	"destination_identity": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return identityFilter(ff.DestinationIdentity, (*flow.Flow).GetDestination), nil
	},
	"source_port": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return portFilter("source_port", ff.SourcePort, sourcePort)
	},
	"destination_port": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return portFilter("destination_port", ff.DestinationPort, destinationPort)
	},
	"verdict": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return enumFilter(ff.Verdict, (*flow.Flow).GetVerdict), nil
	},
	"drop_reason_desc": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return enumFilter(ff.DropReasonDesc, (*flow.Flow).GetDropReasonDesc), nil
	},
	"traffic_direction": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return enumFilter(ff.TrafficDirection, (*flow.Flow).GetTrafficDirection), nil
	},
	"ip_version": func(ff *flow.FlowFilter) (flowPredicate, error) {
		return enumFilter(ff.IpVersion, func(f *flow.Flow) flow.IPVersion { return f.GetIP().GetIpVersion() }), nil
	},
	"protocol":   func(ff *flow.FlowFilter) (flowPredicate, error) { return protocolFilter(ff.Protocol) },
	"event_type": func(ff *flow.FlowFilter) (flowPredicate, error) { return eventTypeFilter(ff.EventType), nil },
	"reply":      func(ff *flow.FlowFilter) (flowPredicate, error) { return replyFilter(ff.Reply), nil },
	"tcp_flags":  func(ff *flow.FlowFilter) (flowPredicate, error) { return tcpFlagsFilter(ff.TcpFlags), nil },
	"node_name":  func(ff *flow.FlowFilter) (flowPredicate, error) { return nodeNameFilter(ff.NodeName) },
	"interface":  func(ff *flow.FlowFilter) (flowPredicate, error) { return interfaceFilter(ff.Interface), nil },
}

// supportedFilterFields lists the FlowFilter fields the server evaluates.
func supportedFilterFields() []string {
	var names []string
	for name := range filterFields {
		names = append(names, string(name))
	}
	slices.Sort(names)
	return names
}

// compileFilter turns the fields ff sets into predicates, all of which a
// flow must match.
func compileFilter(ff *flow.FlowFilter) ([]flowPredicate, error) {
	var (
		preds []flowPredicate
		err   error
	)
	ff.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		compile, ok := filterFields[fd.Name()]
		if !ok {
			err = fmt.Errorf("filter field %s is not supported by this server (supported: %s)",
				fd.Name(), strings.Join(supportedFilterFields(), ", "))
			return false
		}
		var p flowPredicate
		if p, err = compile(ff); err != nil {
			return false
		}
		preds = append(preds, p)
		return true
	})
	return preds, err
}

func sourceIP(f *flow.Flow) string      { return f.GetIP().GetSource() }
func destinationIP(f *flow.Flow) string { return f.GetIP().GetDestination() }

// ipFilter matches addresses and CIDRs, "10.244.0.5" or "10.244.0.0/16".
func ipFilter(field string, values []string, get func(*flow.Flow) string) (flowPredicate, error) {
	prefixes := make([]netip.Prefix, 0, len(values))
	for _, v := range values {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return nil, fmt.Errorf("invalid %s %q: want an address such as 10.244.0.5 or a CIDR such as 10.244.0.0/16", field, v)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		prefixes = append(prefixes, p.Masked())
	}
	return func(f *flow.Flow) bool {
		a, err := netip.ParseAddr(get(f))
		if err != nil {
			return false
		}
		return slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) })
	}, nil
}

func sourcePod(f *flow.Flow) (string, string) {
	return f.GetSource().GetNamespace(), f.GetSource().GetPodName()
}
func destinationPod(f *flow.Flow) (string, string) {
	return f.GetDestination().GetNamespace(), f.GetDestination().GetPodName()
}
func sourceService(f *flow.Flow) (string, string) {
	return f.GetSourceService().GetNamespace(), f.GetSourceService().GetName()
}
func destinationService(f *flow.Flow) (string, string) {
	return f.GetDestinationService().GetNamespace(), f.GetDestinationService().GetName()
}

// nameFilter matches pods or services by "namespace/name-prefix":
// "default/web" matches web-1 and web-2 in default, "default/" every one
// in default, "/web" web-1 in any namespace and "/" every one; a value
// without a namespace, as in kubectl, means the default namespace. These
// are the values the hubble CLI sends for --pod, --namespace and
// --all-namespaces.
func nameFilter(field string, values []string, get func(*flow.Flow) (ns, name string)) (flowPredicate, error) {
	type want struct{ ns, prefix string }
	wants := make([]want, 0, len(values))
	for _, v := range values {
		ns, prefix, found := strings.Cut(v, "/")
		if !found {
			ns, prefix = "default", v
		}
		if v == "" || strings.Contains(prefix, "/") {
			return nil, fmt.Errorf("invalid %s %q: want namespace/name-prefix, namespace/, /name-prefix (any namespace) or a name in namespace default", field, v)
		}
		wants = append(wants, want{ns, prefix})
	}
	return func(f *flow.Flow) bool {
		ns, name := get(f)
		if name == "" {
			return false
		}
		return slices.ContainsFunc(wants, func(w want) bool {
			return (w.ns == "" || w.ns == ns) && strings.HasPrefix(name, w.prefix)
		})
	}, nil
}

// identityFilter matches the flow endpoint get gives by security identity.
func identityFilter(ids []uint32, get func(*flow.Flow) *flow.Endpoint) flowPredicate {
	return func(f *flow.Flow) bool {
		ep := get(f)
		return ep != nil && slices.Contains(ids, ep.GetIdentity())
	}
}

// label is one of an endpoint's labels, "source:key=value".
type label struct{ source, key, value string }

func parseLabel(s string) label {
	kv, value, _ := strings.Cut(s, "=")
	source, key, found := strings.Cut(kv, ":")
	if !found {
		source, key = "", kv
	}
	return label{source, key, value}
}

// labelFilter matches endpoints' labels ("k8s:app=web") against label
// selectors in Kubernetes' syntax (k8s.io/apimachinery/pkg/labels: k=v,
// k!=v, k in (a,b), k notin (a,b), k and !k, terms ANDed), whose keys may
// carry a label source: "k8s:app" matches the app labels of source k8s
// only, "app" those of any source, as Cilium's selectors do.
func labelFilter(field string, selectors []string, get func(*flow.Flow) *flow.Endpoint) (flowPredicate, error) {
	var sels []labels.Selector
	for _, s := range selectors {
		sel, err := ParseLabelSelector(s)
		if err != nil {
			return nil, fmt.Errorf("invalid %s %q: %w", field, s, err)
		}
		sels = append(sels, sel)
	}
	return func(f *flow.Flow) bool {
		var ls endpointLabels
		for _, l := range get(f).GetLabels() {
			ls = append(ls, parseLabel(l))
		}
		return slices.ContainsFunc(sels, func(sel labels.Selector) bool { return sel.Matches(ls) })
	}, nil
}

// ParseLabelSelector parses a label selector whose keys may carry a source
// (see labelFilter). Kubernetes' parser takes no ':' in a key, so every key
// is rewritten to "<source>.<key>", "any" standing for no source, and
// endpointLabels reads the keys back the same way.
func ParseLabelSelector(selector string) (labels.Selector, error) {
	return labels.Parse(sourcedKeys(selector))
}

// sourcedKeys rewrites the key of every term of selector: "k8s:app=web"
// becomes "k8s.app=web", "!tier" becomes "!any.tier". A term's key starts
// it (after blanks and a "!") and ends at a blank or an operator; commas
// inside "in (a, b)" do not start terms.
func sourcedKeys(selector string) string {
	var b strings.Builder
	depth, termStart := 0, true
	for i := 0; i < len(selector); {
		c := selector[i]
		switch {
		case termStart && (c == ' ' || c == '!'):
			b.WriteByte(c)
			i++
			continue
		case termStart:
			end := i
			for end < len(selector) && !strings.ContainsRune(" =!<>(,)", rune(selector[end])) {
				end++
			}
			key := selector[i:end]
			if source, name, ok := strings.Cut(key, ":"); ok {
				key = source + "." + name
			} else if key != "" {
				key = "any." + key
			}
			b.WriteString(key)
			i, termStart = end, false
			continue
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0:
			termStart = true
		}
		b.WriteByte(c)
		i++
	}
	return b.String()
}

// endpointLabels are an endpoint's labels as a selector reads them, by
// the keys sourcedKeys makes.
type endpointLabels []label

func (ls endpointLabels) Has(key string) bool { _, ok := ls.Lookup(key); return ok }

func (ls endpointLabels) Get(key string) string { v, _ := ls.Lookup(key); return v }

func (ls endpointLabels) Lookup(key string) (string, bool) {
	source, name, _ := strings.Cut(key, ".")
	for _, l := range ls {
		if l.key == name && (source == "any" || source == l.source) {
			return l.value, true
		}
	}
	return "", false
}

// Ports is a flow's TCP, UDP or SCTP source and destination ports; ok is
// false for a flow of another protocol, which has none.
func Ports(f *flow.Flow) (src, dst uint32, ok bool) {
	switch l4 := f.GetL4().GetProtocol().(type) {
	case *flow.Layer4_TCP:
		return l4.TCP.GetSourcePort(), l4.TCP.GetDestinationPort(), true
	case *flow.Layer4_UDP:
		return l4.UDP.GetSourcePort(), l4.UDP.GetDestinationPort(), true
	case *flow.Layer4_SCTP:
		return l4.SCTP.GetSourcePort(), l4.SCTP.GetDestinationPort(), true
	}
	return 0, 0, false
}

func sourcePort(f *flow.Flow) (uint32, bool) {
	src, _, ok := Ports(f)
	return src, ok
}

func destinationPort(f *flow.Flow) (uint32, bool) {
	_, dst, ok := Ports(f)
	return dst, ok
}

// portFilter matches TCP, UDP and SCTP ports.
func portFilter(field string, values []string, get func(*flow.Flow) (uint32, bool)) (flowPredicate, error) {
	ports := make([]uint32, 0, len(values))
	for _, v := range values {
		p, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("invalid %s %q: want a port number 0-65535", field, v)
		}
		ports = append(ports, uint32(p))
	}
	return func(f *flow.Flow) bool {
		p, ok := get(f)
		return ok && slices.Contains(ports, p)
	}, nil
}

func enumFilter[E comparable](values []E, get func(*flow.Flow) E) flowPredicate {
	return func(f *flow.Flow) bool { return slices.Contains(values, get(f)) }
}

// protocols are the values of the protocol filter: "icmp" is either ICMP.
var protocols = map[string]func(*flow.Layer4) bool{
	"tcp":    func(l4 *flow.Layer4) bool { return l4.GetTCP() != nil },
	"udp":    func(l4 *flow.Layer4) bool { return l4.GetUDP() != nil },
	"sctp":   func(l4 *flow.Layer4) bool { return l4.GetSCTP() != nil },
	"icmpv4": func(l4 *flow.Layer4) bool { return l4.GetICMPv4() != nil },
	"icmpv6": func(l4 *flow.Layer4) bool { return l4.GetICMPv6() != nil },
	"icmp":   func(l4 *flow.Layer4) bool { return l4.GetICMPv4() != nil || l4.GetICMPv6() != nil },
}

func protocolFilter(values []string) (flowPredicate, error) {
	var tests []func(*flow.Layer4) bool
	for _, v := range values {
		test, ok := protocols[strings.ToLower(v)]
		if !ok {
			return nil, fmt.Errorf("invalid protocol %q: want tcp, udp, sctp, icmp, icmpv4 or icmpv6", v)
		}
		tests = append(tests, test)
	}
	return func(f *flow.Flow) bool {
		l4 := f.GetL4()
		return l4 != nil && slices.ContainsFunc(tests, func(t func(*flow.Layer4) bool) bool { return t(l4) })
	}, nil
}

func eventTypeFilter(values []*flow.EventTypeFilter) flowPredicate {
	return func(f *flow.Flow) bool {
		et := f.GetEventType()
		if et == nil {
			return false
		}
		return slices.ContainsFunc(values, func(want *flow.EventTypeFilter) bool {
			return want.GetType() == et.GetType() && (!want.GetMatchSubType() || want.GetSubType() == et.GetSubType())
		})
	}
}

// replyFilter matches flows known to be replies (true) or not (false);
// flows of packets whose direction is unknown match neither.
func replyFilter(values []bool) flowPredicate {
	return func(f *flow.Flow) bool {
		r := f.GetIsReply()
		return r != nil && slices.Contains(values, r.GetValue())
	}
}

// tcpFlagsFilter matches TCP flows that carry every flag of one value.
func tcpFlagsFilter(values []*flow.TCPFlags) flowPredicate {
	return func(f *flow.Flow) bool {
		have := f.GetL4().GetTCP().GetFlags()
		if have == nil {
			return false
		}
		return slices.ContainsFunc(values, func(want *flow.TCPFlags) bool {
			return (!want.SYN || have.SYN) && (!want.ACK || have.ACK) && (!want.FIN || have.FIN) &&
				(!want.RST || have.RST) && (!want.PSH || have.PSH) && (!want.URG || have.URG) &&
				(!want.ECE || have.ECE) && (!want.CWR || have.CWR) && (!want.NS || have.NS)
		})
	}
}

// nodeNameFilter matches node names against shell patterns ("node-*").
func nodeNameFilter(patterns []string) (flowPredicate, error) {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil {
			return nil, fmt.Errorf("invalid node_name %q: want a name or a pattern such as node-*", p)
		}
	}
	return func(f *flow.Flow) bool {
		return slices.ContainsFunc(patterns, func(p string) bool {
			ok, _ := path.Match(p, f.GetNodeName())
			return ok
		})
	}, nil
}

// interfaceFilter matches the interface a packet was seen on, by the index
// and name each value sets.
func interfaceFilter(values []*flow.NetworkInterface) flowPredicate {
	return func(f *flow.Flow) bool {
		have := f.GetInterface()
		if have == nil {
			return false
		}
		return slices.ContainsFunc(values, func(want *flow.NetworkInterface) bool {
			return (want.Index == 0 || want.Index == have.Index) && (want.Name == "" || want.Name == have.Name)
		})
	}
}
