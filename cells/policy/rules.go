package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/index"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// IP protocol numbers of the protocols a NetworkPolicy port may name.
const (
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// ProtocolName is the name of an IP protocol number ("any" for 0).
func ProtocolName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	}
	return fmt.Sprint(p)
}

// Port is one port of a rule: Protocol 0 is every protocol and port (a
// rule with no ports); Port 0 is every port of Protocol; EndPort 0 is Port
// alone. Name is a named port, resolved on the destination pod.
type Port struct {
	Protocol uint8  `json:"protocol"`
	Port     uint16 `json:"port,omitempty"`
	EndPort  uint16 `json:"endPort,omitempty"`
	Name     string `json:"name,omitempty"`
}

func (p Port) String() string {
	switch {
	case p.Protocol == 0:
		return "any"
	case p.Name != "":
		return p.Name + "/" + ProtocolName(p.Protocol)
	case p.Port == 0:
		return "*/" + ProtocolName(p.Protocol)
	case p.EndPort != 0:
		return fmt.Sprintf("%d-%d/%s", p.Port, p.EndPort, ProtocolName(p.Protocol))
	}
	return fmt.Sprintf("%d/%s", p.Port, ProtocolName(p.Protocol))
}

// IPBlock is an ipBlock peer as written.
type IPBlock struct {
	CIDR   netip.Prefix   `json:"cidr"`
	Except []netip.Prefix `json:"except,omitempty"`
}

// PeerRule is one ingress or egress rule of a NetworkPolicy: traffic with
// any of its peers to any of its ports.
type PeerRule struct {
	// Everyone: the rule's from (to) is omitted or empty: any peer, in or
	// out of the cluster.
	Everyone bool `json:"everyone,omitempty"`
	// Selectors are the keys of the selector cache's selectors of the
	// pod and namespace selector peers.
	Selectors []string `json:"selectors,omitempty"`
	// IPBlocks are the ipBlock peers: they match the peer's address,
	// whoever has it, pods included (see docs/cells/policy.md).
	IPBlocks []IPBlock `json:"ipBlocks,omitempty"`
	// Ports: empty is every port and protocol.
	Ports []Port `json:"ports,omitempty"`
}

// Rule is one row of the table "policy-rules": a NetworkPolicy as the agent
// understands it. A policy the agent cannot apply has Error set and no
// rules; the last version it could apply stays in force (see doc.go).
type Rule struct {
	// Name is "namespace/name".
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// PodSelector is the policy's podSelector, as text.
	PodSelector string `json:"podSelector"`
	// Ingress and Egress are the policy types: the directions in which
	// the pods it selects are isolated.
	Ingress      bool       `json:"ingress"`
	Egress       bool       `json:"egress"`
	IngressRules []PeerRule `json:"ingressRules,omitempty"`
	EgressRules  []PeerRule `json:"egressRules,omitempty"`
	// Error says why the policy cannot be applied.
	Error string `json:"error,omitempty"`

	subject   k8slabels.Selector
	selectors map[string]*peerSelector
}

func (r *Rule) TableHeader() []string {
	return []string{"Name", "PodSelector", "Types", "Ingress", "Egress", "Error"}
}

func (r *Rule) TableRow() []string {
	return []string{r.Name, r.PodSelector, r.types(), fmt.Sprint(len(r.IngressRules)), fmt.Sprint(len(r.EgressRules)), r.Error}
}

func (r *Rule) types() string {
	var t []string
	if r.Ingress {
		t = append(t, "Ingress")
	}
	if r.Egress {
		t = append(t, "Egress")
	}
	return strings.Join(t, ",")
}

// selects says whether the policy applies to a pod of namespace with labels.
func (r *Rule) selects(namespace string, podLabels map[string]string) bool {
	return r.Error == "" && namespace == r.Namespace && r.subject.Matches(k8slabels.Set(podLabels))
}

// blocks are the policy's ipBlocks, each once.
func (r *Rule) blocks() []IPBlock {
	seen := map[string]bool{}
	var out []IPBlock
	for _, pr := range slices.Concat(r.IngressRules, r.EgressRules) {
		for _, b := range pr.IPBlocks {
			if k := b.key(); !seen[k] {
				seen[k] = true
				out = append(out, b)
			}
		}
	}
	return out
}

// namedPorts says whether the rules of a direction have a named port.
func namedPorts(rules []PeerRule) bool {
	for _, pr := range rules {
		for _, p := range pr.Ports {
			if p.Name != "" {
				return true
			}
		}
	}
	return false
}

// RuleByName is the primary index of "policy-rules".
var RuleByName = statedb.Index[*Rule, string]{
	Name:       "name",
	FromObject: func(r *Rule) index.KeySet { return index.NewKeySet(index.String(r.Name)) },
	FromKey:    index.String,
	FromString: index.FromString,
	Unique:     true,
}

// RulesTableName is the name of the table of NetworkPolicies.
const RulesTableName = "policy-rules"

// NewRulesTable registers the table "policy-rules".
func NewRulesTable(db *statedb.DB) (statedb.RWTable[*Rule], error) {
	return statedb.NewTable(db, RulesTableName, RuleByName)
}

// Translate reads a NetworkPolicy into a Rule, as the API server would
// have defaulted it (policyTypes, protocol TCP). A policy the agent cannot
// apply comes back with Error naming it and what is wrong.
func Translate(np *networkingv1.NetworkPolicy) *Rule {
	r := &Rule{Name: np.Namespace + "/" + np.Name, Namespace: np.Namespace, selectors: map[string]*peerSelector{}}
	if err := r.translate(&np.Spec); err != nil {
		return &Rule{Name: r.Name, Namespace: r.Namespace, PodSelector: r.PodSelector,
			Error: fmt.Sprintf("NetworkPolicy %s: %v", r.Name, err)}
	}
	return r
}

func (r *Rule) translate(spec *networkingv1.NetworkPolicySpec) error {
	subject, err := metav1.LabelSelectorAsSelector(&spec.PodSelector)
	if err != nil {
		return fmt.Errorf("podSelector: %w", err)
	}
	r.subject, r.PodSelector = subject, subject.String()
	if len(spec.PolicyTypes) == 0 {
		// The API server's default: ingress always, egress when the
		// policy has egress rules.
		r.Ingress, r.Egress = true, len(spec.Egress) > 0
	}
	for _, t := range spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			r.Ingress = true
		case networkingv1.PolicyTypeEgress:
			r.Egress = true
		default:
			return fmt.Errorf("policyTypes: %q is neither Ingress nor Egress", t)
		}
	}
	if r.Ingress {
		for i, in := range spec.Ingress {
			pr, err := r.peerRule(in.From, in.Ports)
			if err != nil {
				return fmt.Errorf("ingress[%d]: %w", i, err)
			}
			r.IngressRules = append(r.IngressRules, pr)
		}
	}
	if r.Egress {
		for i, out := range spec.Egress {
			pr, err := r.peerRule(out.To, out.Ports)
			if err != nil {
				return fmt.Errorf("egress[%d]: %w", i, err)
			}
			r.EgressRules = append(r.EgressRules, pr)
		}
	}
	return nil
}

func (r *Rule) peerRule(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (PeerRule, error) {
	pr := PeerRule{Everyone: len(peers) == 0}
	for i, peer := range peers {
		if peer.IPBlock != nil {
			if peer.PodSelector != nil || peer.NamespaceSelector != nil {
				return pr, fmt.Errorf("peer %d: ipBlock cannot be combined with a selector", i)
			}
			b, err := ipBlock(peer.IPBlock)
			if err != nil {
				return pr, fmt.Errorf("peer %d: %w", i, err)
			}
			pr.IPBlocks = append(pr.IPBlocks, b)
			continue
		}
		sel, err := newPeerSelector(r.Namespace, peer.PodSelector, peer.NamespaceSelector)
		if err != nil {
			return pr, fmt.Errorf("peer %d: %w", i, err)
		}
		if !slices.Contains(pr.Selectors, sel.key) {
			pr.Selectors = append(pr.Selectors, sel.key)
		}
		r.selectors[sel.key] = sel
	}
	for i, p := range ports {
		port, err := translatePort(p)
		if err != nil {
			return pr, fmt.Errorf("ports[%d]: %w", i, err)
		}
		pr.Ports = append(pr.Ports, port)
	}
	return pr, nil
}

func ipBlock(b *networkingv1.IPBlock) (IPBlock, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return IPBlock{}, fmt.Errorf("ipBlock cidr %q: want a CIDR such as 10.0.0.0/8", b.CIDR)
	}
	out := IPBlock{CIDR: cidr.Masked()}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			return IPBlock{}, fmt.Errorf("ipBlock except %q: want a CIDR such as 10.1.0.0/16", e)
		}
		ex = ex.Masked()
		if ex.Addr().Is4() != cidr.Addr().Is4() || ex.Bits() <= cidr.Bits() || !cidr.Contains(ex.Addr()) {
			return IPBlock{}, fmt.Errorf("ipBlock except %s is not strictly inside cidr %s", ex, out.CIDR)
		}
		out.Except = append(out.Except, ex)
	}
	return out, nil
}

var errEndPortNamed = errors.New("endPort needs a numeric port")

func translatePort(p networkingv1.NetworkPolicyPort) (Port, error) {
	out := Port{Protocol: ProtoTCP}
	if p.Protocol != nil {
		switch *p.Protocol {
		case "TCP":
		case "UDP":
			out.Protocol = ProtoUDP
		case "SCTP":
			out.Protocol = ProtoSCTP
		default:
			return out, fmt.Errorf("protocol %q: want TCP, UDP or SCTP", *p.Protocol)
		}
	}
	if p.Port == nil {
		if p.EndPort != nil {
			return out, errEndPortNamed
		}
		return out, nil
	}
	if p.Port.Type == intstr.String {
		if p.EndPort != nil {
			return out, fmt.Errorf("port %q: %w", p.Port.StrVal, errEndPortNamed)
		}
		if p.Port.StrVal == "" {
			return out, errors.New("port: empty name")
		}
		out.Name = p.Port.StrVal
		return out, nil
	}
	if p.Port.IntVal < 1 || p.Port.IntVal > 65535 {
		return out, fmt.Errorf("port %d: want 1 to 65535", p.Port.IntVal)
	}
	out.Port = uint16(p.Port.IntVal)
	if p.EndPort != nil {
		if *p.EndPort < p.Port.IntVal || *p.EndPort > 65535 {
			return out, fmt.Errorf("endPort %d: want from port %d to 65535", *p.EndPort, p.Port.IntVal)
		}
		if *p.EndPort != p.Port.IntVal {
			out.EndPort = uint16(*p.EndPort)
		}
	}
	return out, nil
}
