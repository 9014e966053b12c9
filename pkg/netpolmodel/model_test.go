package netpolmodel

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

func policies(t *testing.T, docs ...string) []networkingv1.NetworkPolicy {
	t.Helper()
	var out []networkingv1.NetworkPolicy
	for _, d := range docs {
		var p networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(d), &p); err != nil {
			t.Fatalf("policy %q: %v", d, err)
		}
		out = append(out, p)
	}
	return out
}

// Each verdict here is checked by hand against the specification; the
// comment says why.
func TestAllowed(t *testing.T) {
	ports := []corev1.ContainerPort{
		{Name: "serve-80-tcp", ContainerPort: 80, Protocol: corev1.ProtocolTCP},
		{Name: "serve-81-udp", ContainerPort: 81, Protocol: corev1.ProtocolUDP},
	}
	xa := Pod{Namespace: "x", Name: "a", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.0.1.1"), Ports: ports}
	xb := Pod{Namespace: "x", Name: "b", Labels: map[string]string{"pod": "b"}, IP: netip.MustParseAddr("10.0.1.2"), Ports: ports}
	ya := Pod{Namespace: "y", Name: "a", Labels: map[string]string{"pod": "a"}, IP: netip.MustParseAddr("10.0.2.1"), Ports: ports}
	tcp80, tcp81 := Port{80, corev1.ProtocolTCP}, Port{81, corev1.ProtocolTCP}
	udp80, udp81 := Port{80, corev1.ProtocolUDP}, Port{81, corev1.ProtocolUDP}

	type check struct {
		from, to Pod
		port     Port
		want     bool
		why      string
	}
	for _, tc := range []struct {
		name     string
		policies []string
		nsLabels map[string]map[string]string
		checks   []check
	}{
		{
			name: "no policy",
			checks: []check{
				{xb, xa, udp80, true, "nothing is isolated"},
			},
		},
		{
			name:     "default deny ingress in x",
			policies: []string{`{metadata: {name: deny, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress]}}`},
			checks: []check{
				{xb, xa, tcp80, false, "x/a is isolated for ingress, no rule"},
				{ya, xa, tcp80, false, "likewise from another namespace"},
				{xa, ya, tcp80, true, "y is not isolated, and x's egress is not"},
				{xa, xa, tcp80, true, "a pod's connection to itself"},
			},
		},
		{
			name: "pod and namespace selector in one peer: AND",
			policies: []string{`{metadata: {name: p, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
				ingress: [{from: [{namespaceSelector: {matchLabels: {team: "y"}}, podSelector: {matchLabels: {pod: a}}}]}]}}`},
			nsLabels: map[string]map[string]string{"y": {"team": "y"}},
			checks: []check{
				{ya, xa, tcp81, true, "y has team=y and y/a has pod=a"},
				{xb, xa, tcp81, false, "x has no team label"},
				{xa, xb, tcp81, true, "x/b is not selected"},
			},
		},
		{
			name: "pod and namespace selector in two peers: OR",
			policies: []string{`{metadata: {name: p, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
				ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}}, {podSelector: {matchLabels: {pod: b}}}]}]}}`},
			checks: []check{
				{ya, xa, tcp80, true, "namespace y by its name label"},
				{xb, xa, udp80, true, "pod=b of the policy's namespace"},
			},
		},
		{
			name: "egress named port, and ingress isolation by default",
			policies: []string{`{metadata: {name: p, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
				egress: [{ports: [{port: serve-81-udp, protocol: UDP}]}]}}`},
			checks: []check{
				{xa, ya, udp81, true, "y/a's container port serve-81-udp is 81/UDP"},
				{xa, ya, tcp81, false, "the named port is UDP"},
				{xa, ya, udp80, false, "port 80 is not serve-81-udp"},
				{xb, xa, tcp80, false, "policyTypes defaults to Ingress and Egress: isolated for ingress with no rule"},
			},
		},
		{
			name: "endPort range and protocol",
			policies: []string{`{metadata: {name: p, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress],
				ingress: [{ports: [{port: 80, endPort: 81}]}]}}`},
			checks: []check{
				{ya, xa, tcp80, true, "80 in 80-81"},
				{ya, xa, tcp81, true, "81 in 80-81"},
				{ya, xa, udp80, false, "protocol defaults to TCP"},
			},
		},
		{
			name: "ipBlock with except, and policies add up",
			policies: []string{
				`{metadata: {name: p, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress],
				egress: [{to: [{ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.2/32]}}]}]}}`,
				`{metadata: {name: q, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress],
				egress: [{to: [{podSelector: {}}], ports: [{port: 81, protocol: UDP}]}]}}`,
			},
			checks: []check{
				{xa, ya, tcp80, true, "10.0.2.1 is in the block"},
				{xa, xb, tcp80, false, "10.0.1.2 is excepted"},
				{xa, xb, udp81, true, "the other policy allows UDP 81 to x's pods"},
				{xb, xa, tcp80, true, "only egress is isolated"},
			},
		},
		{
			name:     "a policy of another namespace does not select",
			policies: []string{`{metadata: {name: deny, namespace: "y"}, spec: {podSelector: {matchLabels: {pod: a}}}}`},
			checks: []check{
				{xb, xa, tcp80, true, "y's policy selects y/a only"},
				{xa, ya, tcp80, false, "y/a is isolated for ingress"},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Cluster{NamespaceLabels: tc.nsLabels, Pods: []Pod{xa, xb, ya}, Policies: policies(t, tc.policies...)}
			for _, ch := range tc.checks {
				got, err := c.Allowed(ch.from, ch.to, ch.port)
				if err != nil || got != ch.want {
					t.Errorf("%s -> %s %s = %v, %v; want %v: %s", ch.from, ch.to, ch.port, got, err, ch.want, ch.why)
				}
			}
		})
	}
}

func TestBadPolicy(t *testing.T) {
	xa := Pod{Namespace: "x", Name: "a"}
	c := Cluster{Pods: []Pod{xa}, Policies: policies(t, `{metadata: {name: p, namespace: x}, spec: {podSelector: {},
		ingress: [{from: [{podSelector: {matchExpressions: [{key: pod, operator: Bogus}]}}]}]}}`)}
	_, err := c.Allowed(Pod{Namespace: "x", Name: "b"}, xa, Port{80, corev1.ProtocolTCP})
	if err == nil || !strings.Contains(err.Error(), "policy x/p: Ingress[0]: podSelector") {
		t.Errorf("Allowed with a bad selector = %v, want an error naming the policy and rule", err)
	}
}

func TestMatrixDiff(t *testing.T) {
	xa := Pod{Namespace: "x", Name: "a", Labels: map[string]string{"pod": "a"}}
	xb := Pod{Namespace: "x", Name: "b", Labels: map[string]string{"pod": "b"}}
	c := Cluster{Pods: []Pod{xa, xb}, Policies: policies(t, `{metadata: {name: deny, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}}}`)}
	want, err := c.Expect(Port{80, corev1.ProtocolTCP})
	if err != nil {
		t.Fatal(err)
	}
	got := NewMatrix(want.Port, want.Pods)
	got.Allowed = [][]bool{{true, false}, {true, true}}
	if n := want.Differences(got); n != 2 {
		t.Fatalf("Differences = %d, want 2", n)
	}
	diff := want.Diff(got)
	wantDiff := "TCP/80: 2 of 4 pairs differ (rows: from, columns: to; X: allowed, want denied; !: denied, want allowed)\n" +
		"     expected  actual    diff\n" +
		"     x/a x/b   x/a x/b   x/a x/b \n" +
		"x/a    1   1     1   0     .   ! \n" +
		"x/b    0   1     1   1     X   . "
	if diff != wantDiff {
		t.Errorf("Diff =\n%s\nwant\n%s", diff, wantDiff)
	}
}
