package devcluster_test

// The cases of the upstream suite (test/e2e/network/netpol/network_policy.go),
// by its test names, with their policies and changes; the expected tables
// come from package netpolmodel, not from here. Every step is probed on
// every port and protocol, so one case here covers the upstream TCP, UDP
// and SCTP variants of it. A bare y in YAML is a boolean: namespace y is
// quoted.
var netpolCases = []netpolCase{
	{name: "default-deny-ingress", steps: []netpolStep{{what: "deny ingress in x", policies: []string{
		`{metadata: {name: deny-ingress, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress]}}`}}}},

	{name: "default-deny-all", steps: []netpolStep{{what: "deny ingress and egress in x", policies: []string{
		`{metadata: {name: deny-all, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress, Egress]}}`}}}},

	{name: "allow traffic from pods within server namespace based on PodSelector", steps: []netpolStep{{what: "x/a from pod=b", policies: []string{
		`{metadata: {name: x-a-allows-x-b, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}]}}`}}}},

	{name: "allow ingress traffic for a target", steps: []netpolStep{{what: "deny x, allow all to x/a", policies: []string{
		`{metadata: {name: deny-all, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress]}}`,
		`{metadata: {name: allow-all-to-a, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{podSelector: {}, namespaceSelector: {}}]}]}}`}}}},

	{name: "allow traffic only from a different namespace, based on NamespaceSelector", steps: []netpolStep{{what: "x/a from namespace y by its name", policies: []string{
		`{metadata: {name: allow-client-a-via-ns-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}}]}]}}`}}}},

	{name: "PodSelector or NamespaceSelector", steps: []netpolStep{{what: "x/a from namespaces not x, or pod=b", policies: []string{
		`{metadata: {name: allow-ns-y-match-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}]}},
		                    {podSelector: {matchLabels: {pod: b}}}]}]}}`}}}},

	{name: "PodSelector and NamespaceSelector", steps: []netpolStep{{what: "x/a from pod=b of namespaces not x", policies: []string{
		`{metadata: {name: allow-ns-y-podselector-and-nsselector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}]},
		                     podSelector: {matchLabels: {pod: b}}}]}]}}`}}}},

	{name: "Multiple PodSelectors and NamespaceSelectors", steps: []netpolStep{{what: "x/a from pod in (b, c) of namespaces not x", policies: []string{
		`{metadata: {name: allow-ns-y-z-pod-b-c, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [x]}]},
		                     podSelector: {matchExpressions: [{key: pod, operator: In, values: [b, c]}]}}]}]}}`}}}},

	{name: "allow traffic from a pod in a different namespace based on PodSelector and NamespaceSelector", steps: []netpolStep{{what: "x/a from y/a", policies: []string{
		`{metadata: {name: allow-ns-y-pod-a, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: "y"}}, podSelector: {matchLabels: {pod: a}}}]}]}}`}}}},

	{name: "multiple, stacked policies with overlapping podSelectors (Ports)", steps: []netpolStep{
		{what: "x/a from namespace y on TCP 81", policies: []string{
			`{metadata: {name: allow-client-a-via-ns-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
			  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: "y"}}}], ports: [{port: 81, protocol: TCP}]}]}}`}},
		{what: "and a second policy for TCP 80", policies: []string{
			`{metadata: {name: allow-client-a-via-ns-selector-80, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
			  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: "y"}}}], ports: [{port: 80, protocol: TCP}]}]}}`}},
	}},

	{name: "allow ingress access on one named port", steps: []netpolStep{{what: "x from anyone on serve-81-tcp", policies: []string{
		`{metadata: {name: allow-all, namespace: x}, spec: {podSelector: {}, ingress: [{ports: [{port: serve-81-tcp}]}]}}`}}}},

	{name: "allow ingress access from namespace on one named port", steps: []netpolStep{{what: "x/a from namespace y on serve-80-tcp and serve-81-udp", policies: []string{
		`{metadata: {name: allow-client-a-via-ns-selector-80, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: "y"}}}], ports: [{port: serve-80-tcp, protocol: TCP}, {port: serve-81-udp, protocol: UDP}]}]}}`}}}},

	{name: "allow egress access on one named port", steps: []netpolStep{{what: "x to anyone on serve-80-tcp and serve-81-udp", policies: []string{
		`{metadata: {name: allow-egress, namespace: x}, spec: {podSelector: {}, policyTypes: [Egress],
		  egress: [{ports: [{port: serve-80-tcp}, {port: serve-81-udp, protocol: UDP}]}]}}`}}}},

	{name: "Ports range with endPort", steps: []netpolStep{{what: "x/a from namespace y on TCP 80-81 and UDP 81-90", policies: []string{
		`{metadata: {name: allow-range, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: "y"}}}], ports: [{port: 80, endPort: 81}, {port: 81, endPort: 90, protocol: UDP}]}]}}`}}}},

	{name: "enforce updated policy", steps: []netpolStep{
		{what: "allow all into x", policies: []string{
			`{metadata: {name: allow-all-mutate-to-deny-all, namespace: x}, spec: {podSelector: {}, ingress: [{}]}}`}},
		{what: "the same policy updated to deny all", policies: []string{
			`{metadata: {name: allow-all-mutate-to-deny-all, namespace: x}, spec: {podSelector: {}, ingress: []}}`}},
	}},

	{name: "allow ingress access from updated namespace", steps: []netpolStep{
		{what: "x/a from namespaces ns2=updated", policies: []string{
			`{metadata: {name: allow-client-a-via-ns-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
			  ingress: [{from: [{namespaceSelector: {matchLabels: {ns2: updated}}}]}]}}`}},
		{what: "namespace y labelled ns2=updated", nsLabels: map[string]map[string]string{"y": {"ns": "y", "ns2": "updated"}}},
		{what: "the label removed again", nsLabels: map[string]map[string]string{"y": {"ns": "y"}}},
	}},

	{name: "allow ingress access from updated pod", steps: []netpolStep{
		{what: "x/a from pod=b,pod2=updated", policies: []string{
			`{metadata: {name: allow-client-a-via-pod-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
			  ingress: [{from: [{podSelector: {matchLabels: {pod: b, pod2: updated}}}]}]}}`}},
		{what: "x/b labelled pod2=updated", podLabels: map[string]map[string]string{"x/b": {"pod": "b", "pod2": "updated"}}},
	}},

	{name: "deny ingress from pods on other namespaces", steps: []netpolStep{{what: "x from x only", policies: []string{
		`{metadata: {name: deny-empty-policy, namespace: x}, spec: {podSelector: {}, ingress: [{from: [{podSelector: {}}]}]}}`}}}},

	{name: "deny ingress access to updated pod", steps: []netpolStep{
		{what: "deny ingress to target=isolated", policies: []string{
			`{metadata: {name: deny-ingress-via-label-selector, namespace: x}, spec: {podSelector: {matchLabels: {target: isolated}}, policyTypes: [Ingress]}}`}},
		{what: "x/a labelled target=isolated", podLabels: map[string]map[string]string{"x/a": {"pod": "a", "target": "isolated"}}},
	}},

	{name: "deny egress from pods based on PodSelector, then from all pods in a namespace", steps: []netpolStep{
		{what: "deny egress of x/a", policies: []string{
			`{metadata: {name: deny-egress-pod-a, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress]}}`}},
		{what: "deny egress of x instead", delete: []string{"x/deny-egress-pod-a"}, policies: []string{
			`{metadata: {name: deny-egress-ns-x, namespace: x}, spec: {podSelector: {}, policyTypes: [Egress]}}`}},
	}},

	{name: "work with Ingress, Egress specified together", steps: []netpolStep{{what: "x/a from pod=b, to port 80", policies: []string{
		`{metadata: {name: allow-client-a-via-pod-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress, Ingress],
		  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}]}], egress: [{ports: [{port: 80}]}]}}`}}}},

	{name: "deny egress on the client side even if the server allows it", steps: []netpolStep{{what: "x/a to y/a only; y/a and y/b from x/a", policies: []string{
		`{metadata: {name: allow-to-ns-y-pod-a, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}, podSelector: {matchLabels: {pod: a}}}]}]}}`,
		`{metadata: {name: allow-from-xa-on-ya-match-selector, namespace: "y"}, spec: {podSelector: {matchLabels: {pod: a}},
		  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}, podSelector: {matchLabels: {pod: a}}}]}]}}`,
		`{metadata: {name: allow-from-xa-on-yb-match-selector, namespace: "y"}, spec: {podSelector: {matchLabels: {pod: b}},
		  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}, podSelector: {matchLabels: {pod: a}}}]}]}}`}}}},

	{name: "ingress policy allowing any port on a specific protocol", steps: []netpolStep{{what: "x/a from anyone on TCP", policies: []string{
		`{metadata: {name: allow-ingress-by-proto, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, ingress: [{ports: [{protocol: TCP}]}]}}`}}}},

	{name: "not treat protocol SCTP or UDP as TCP", steps: []netpolStep{{what: "deny into x; x/a from anyone on SCTP 81, x/b on UDP 81", policies: []string{
		`{metadata: {name: deny-ingress, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress]}}`,
		`{metadata: {name: allow-only-sctp-ingress-on-port-81, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, ingress: [{ports: [{port: 81, protocol: SCTP}]}]}}`,
		`{metadata: {name: allow-only-udp-ingress-on-port-81, namespace: x}, spec: {podSelector: {matchLabels: {pod: b}}, ingress: [{ports: [{port: 81, protocol: UDP}]}]}}`}}}},

	{name: "multiple ingress policies with ingress allow-all taking precedence", steps: []netpolStep{
		{what: "x from anyone on 80", policies: []string{
			`{metadata: {name: allow-ingress-port-80, namespace: x}, spec: {podSelector: {}, ingress: [{ports: [{port: 80}]}]}}`}},
		{what: "and allow all", policies: []string{
			`{metadata: {name: allow-ingress, namespace: x}, spec: {podSelector: {}, ingress: [{}]}}`}},
	}},

	{name: "multiple egress policies with egress allow-all taking precedence", steps: []netpolStep{
		{what: "x to anyone on 80", policies: []string{
			`{metadata: {name: allow-egress-port-80, namespace: x}, spec: {podSelector: {}, egress: [{ports: [{port: 80}]}]}}`}},
		{what: "and allow all", policies: []string{
			`{metadata: {name: allow-egress, namespace: x}, spec: {podSelector: {}, egress: [{}]}}`}},
	}},

	{name: "stop enforcing policies after they are deleted", steps: []netpolStep{
		{what: "deny all of x", policies: []string{
			`{metadata: {name: deny-all, namespace: x}, spec: {podSelector: {}, policyTypes: [Ingress, Egress]}}`}},
		{what: "deleted", delete: []string{"*"}},
	}},

	{name: "allow egress access to server in CIDR block", steps: []netpolStep{{what: "x/a to y/b's address", policies: []string{
		`{metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress],
		  egress: [{to: [{ipBlock: {cidr: "{{ip "y/b"}}/32"}}]}]}}`}}}},

	{name: "except clause while egress access to server in CIDR block, and an IP in both", steps: []netpolStep{
		{what: "x/a to the /4 around x/b except x/b", policies: []string{
			`{metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress],
			  egress: [{to: [{ipBlock: {cidr: "{{cidr4 "x/b"}}", except: ["{{ip "x/b"}}/32"]}}]}]}}`}},
		{what: "the policy updated to x/b alone", policies: []string{
			`{metadata: {name: allow-client-a-via-cidr-egress-rule, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress],
			  egress: [{to: [{ipBlock: {cidr: "{{ip "x/b"}}/32"}}]}]}}`}},
	}},

	{name: "ingress and egress policies controlled independently", steps: []netpolStep{
		{what: "allow all egress of x/a", policies: []string{
			`{metadata: {name: allow-egress-for-target, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Egress], egress: [{}]}}`}},
		{what: "and deny its ingress", policies: []string{
			`{metadata: {name: deny-ingress-via-label-selector, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Ingress]}}`}},
	}},

	{name: "NamespaceSelector with MatchExpressions using default ns label (egress)", steps: []netpolStep{{what: "x/a to namespaces not y", policies: []string{
		`{metadata: {name: allow-ns-y-match-selector-for-immutable-ns-label, namespace: x}, spec: {podSelector: {matchLabels: {pod: a}},
		  egress: [{to: [{namespaceSelector: {matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: ["y"]}]}}]}]}}`}}}},
}
