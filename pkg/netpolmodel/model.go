// Package netpolmodel decides, from the Kubernetes NetworkPolicy
// specification (networking.k8s.io/v1) alone, which pod may connect to
// which: the oracle the end-to-end policy tests compare the datapath with.
// It knows nothing of identities, maps or nodes; it reads policies as the
// API documentation describes them:
//
//   - A pod is isolated for ingress (egress) when a policy of its namespace
//     selects it and has that policy type. policyTypes left empty default
//     as the API server defaults them: Ingress, plus Egress when the policy
//     has egress rules.
//   - A connection needs the source's egress and the destination's ingress
//     to allow it; a direction not isolated allows everything, an isolated
//     one what the union of its policies' rules allows.
//   - A rule allows a peer when it has no peers (everyone) or one of them
//     matches: podSelector alone, pods of the policy's namespace;
//     namespaceSelector alone, every pod of the matching namespaces; both,
//     pods matching both; ipBlock, the peer's address inside cidr and
//     outside every except.
//   - A rule allows a port when it has no ports, or one of them matches:
//     the protocol (TCP when unset), and the port: any when unset, a number
//     or the range [port, endPort], or a name resolved on the destination
//     pod's container ports of that protocol.
//   - Namespaces carry kubernetes.io/metadata.name, as the API server sets
//     it.
//
// One choice the specification leaves open, made here as the upstream
// conformance suite makes it: a pod's connection to its own address never
// leaves the pod, so no policy applies to it (allowed).
package netpolmodel

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// NamespaceNameLabel is the label the API server gives every namespace:
// its name.
const NamespaceNameLabel = "kubernetes.io/metadata.name"

// Pod is a pod as policies see it.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	IP              netip.Addr
	// Ports are its containers' ports, which named ports resolve on.
	Ports []corev1.ContainerPort
}

// String is NAMESPACE/NAME.
func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// Cluster is everything policies decide on.
type Cluster struct {
	// NamespaceLabels are each namespace's labels (without
	// kubernetes.io/metadata.name, which the model adds). A pod's
	// namespace missing here has that label only.
	NamespaceLabels map[string]map[string]string
	Pods            []Pod
	Policies        []networkingv1.NetworkPolicy
}

// Port is a destination port and its protocol.
type Port struct {
	Port     uint16
	Protocol corev1.Protocol
}

func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }

// Allowed says whether from may open a connection to to's address on port.
func (c *Cluster) Allowed(from, to Pod, port Port) (bool, error) {
	if from.Namespace == to.Namespace && from.Name == to.Name {
		return true, nil
	}
	egress, err := c.allows(from, to, to, port, networkingv1.PolicyTypeEgress)
	if err != nil || !egress {
		return false, err
	}
	return c.allows(to, from, to, port, networkingv1.PolicyTypeIngress)
}

// allows is pod's side of a connection with peer in direction dir; dst is
// the destination, on whose ports named ports resolve.
func (c *Cluster) allows(pod, peer, dst Pod, port Port, dir networkingv1.PolicyType) (bool, error) {
	isolated := false
	for i := range c.Policies {
		pol := &c.Policies[i]
		if pol.Namespace != pod.Namespace || !slices.Contains(policyTypes(pol), dir) {
			continue
		}
		sel, err := selector(&pol.Spec.PodSelector)
		if err != nil {
			return false, fmt.Errorf("policy %s/%s: podSelector: %w", pol.Namespace, pol.Name, err)
		}
		if !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		isolated = true
		var rules []rule
		if dir == networkingv1.PolicyTypeIngress {
			for _, r := range pol.Spec.Ingress {
				rules = append(rules, rule{r.From, r.Ports})
			}
		} else {
			for _, r := range pol.Spec.Egress {
				rules = append(rules, rule{r.To, r.Ports})
			}
		}
		for j, r := range rules {
			ok, err := c.ruleAllows(pol.Namespace, r, peer, dst, port)
			if err != nil {
				return false, fmt.Errorf("policy %s/%s: %s[%d]: %w", pol.Namespace, pol.Name, dir, j, err)
			}
			if ok {
				return true, nil
			}
		}
	}
	return !isolated, nil
}

type rule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

// policyTypes are pol's types, defaulted as the API server does.
func policyTypes(pol *networkingv1.NetworkPolicy) []networkingv1.PolicyType {
	if len(pol.Spec.PolicyTypes) > 0 {
		return pol.Spec.PolicyTypes
	}
	types := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	if len(pol.Spec.Egress) > 0 {
		types = append(types, networkingv1.PolicyTypeEgress)
	}
	return types
}

func (c *Cluster) ruleAllows(policyNS string, r rule, peer, dst Pod, port Port) (bool, error) {
	peerOK := len(r.peers) == 0
	for _, p := range r.peers {
		ok, err := c.peerMatches(policyNS, p, peer)
		if err != nil {
			return false, err
		}
		peerOK = peerOK || ok
	}
	if !peerOK {
		return false, nil
	}
	if len(r.ports) == 0 {
		return true, nil
	}
	for _, p := range r.ports {
		if portMatches(p, dst, port) {
			return true, nil
		}
	}
	return false, nil
}

func (c *Cluster) peerMatches(policyNS string, p networkingv1.NetworkPolicyPeer, peer Pod) (bool, error) {
	if p.IPBlock != nil {
		cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
		if err != nil {
			return false, fmt.Errorf("ipBlock: %w", err)
		}
		if !cidr.Contains(peer.IP) {
			return false, nil
		}
		for _, e := range p.IPBlock.Except {
			ex, err := netip.ParsePrefix(e)
			if err != nil {
				return false, fmt.Errorf("ipBlock except: %w", err)
			}
			if ex.Contains(peer.IP) {
				return false, nil
			}
		}
		return true, nil
	}
	if p.NamespaceSelector != nil {
		sel, err := selector(p.NamespaceSelector)
		if err != nil {
			return false, fmt.Errorf("namespaceSelector: %w", err)
		}
		if !sel.Matches(labels.Set(c.namespaceLabels(peer.Namespace))) {
			return false, nil
		}
	} else if peer.Namespace != policyNS {
		return false, nil
	}
	if p.PodSelector != nil {
		sel, err := selector(p.PodSelector)
		if err != nil {
			return false, fmt.Errorf("podSelector: %w", err)
		}
		return sel.Matches(labels.Set(peer.Labels)), nil
	}
	return true, nil
}

func (c *Cluster) namespaceLabels(ns string) map[string]string {
	out := map[string]string{}
	for k, v := range c.NamespaceLabels[ns] {
		out[k] = v
	}
	out[NamespaceNameLabel] = ns
	return out
}

func portMatches(p networkingv1.NetworkPolicyPort, dst Pod, port Port) bool {
	proto := corev1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	if proto != port.Protocol {
		return false
	}
	switch {
	case p.Port == nil:
		return true
	case p.Port.Type == intstr.String:
		return slices.ContainsFunc(dst.Ports, func(cp corev1.ContainerPort) bool {
			cpProto := cp.Protocol
			if cpProto == "" {
				cpProto = corev1.ProtocolTCP
			}
			return cp.Name == p.Port.StrVal && cpProto == proto && cp.ContainerPort == int32(port.Port)
		})
	case p.EndPort != nil:
		return int32(port.Port) >= p.Port.IntVal && int32(port.Port) <= *p.EndPort
	default:
		return int32(port.Port) == p.Port.IntVal
	}
}

func selector(s *metav1.LabelSelector) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(s)
}

// Matrix is a truth table: whether each pod may connect to each, on one
// port.
type Matrix struct {
	Port Port
	// Pods name the rows (sources) and columns (destinations).
	Pods    []string
	Allowed [][]bool
}

// NewMatrix is a matrix of pods on port with nothing allowed.
func NewMatrix(port Port, pods []string) Matrix {
	m := Matrix{Port: port, Pods: pods, Allowed: make([][]bool, len(pods))}
	for i := range m.Allowed {
		m.Allowed[i] = make([]bool, len(pods))
	}
	return m
}

// Expect is the truth table of c's pods on port.
func (c *Cluster) Expect(port Port) (Matrix, error) {
	names := make([]string, len(c.Pods))
	for i, p := range c.Pods {
		names[i] = p.String()
	}
	m := NewMatrix(port, names)
	for i, from := range c.Pods {
		for j, to := range c.Pods {
			ok, err := c.Allowed(from, to, port)
			if err != nil {
				return Matrix{}, err
			}
			m.Allowed[i][j] = ok
		}
	}
	return m, nil
}

// Differences counts the pairs where m and o differ.
func (m Matrix) Differences(o Matrix) int {
	n := 0
	for i := range m.Allowed {
		for j := range m.Allowed[i] {
			if m.Allowed[i][j] != o.Allowed[i][j] {
				n++
			}
		}
	}
	return n
}

// Diff shows expected (m) and actual side by side, rows the sources and
// columns the destinations, 1 allowed and 0 denied, and a third table
// marking each pair that differs: X where a denied connection went
// through, ! where an allowed one did not.
func (m Matrix) Diff(actual Matrix) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d of %d pairs differ (rows: from, columns: to; X: allowed, want denied; !: denied, want allowed)\n",
		m.Port, m.Differences(actual), len(m.Pods)*len(m.Pods))
	w := 0
	for _, p := range m.Pods {
		w = max(w, len(p))
	}
	table := len(m.Pods) * (w + 1)
	fmt.Fprintf(&b, "%*s  %-*s  %-*s  %s\n", w, "", table, "expected", table, "actual", "diff")
	fmt.Fprintf(&b, "%*s", w, "")
	for range 3 {
		b.WriteString("  ")
		for _, p := range m.Pods {
			fmt.Fprintf(&b, "%*s ", w, p)
		}
	}
	b.WriteString("\n")
	cell := func(c string) { fmt.Fprintf(&b, "%*s ", w, c) }
	for i, from := range m.Pods {
		fmt.Fprintf(&b, "%*s", w, from)
		for _, t := range []Matrix{m, actual} {
			b.WriteString("  ")
			for j := range m.Pods {
				if t.Allowed[i][j] {
					cell("1")
				} else {
					cell("0")
				}
			}
		}
		b.WriteString("  ")
		for j := range m.Pods {
			switch want, got := m.Allowed[i][j], actual.Allowed[i][j]; {
			case want == got:
				cell(".")
			case got:
				cell("X")
			default:
				cell("!")
			}
		}
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n")
}
