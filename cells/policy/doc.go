// Package policy is the control plane of Kubernetes NetworkPolicy: it
// reads NetworkPolicies into the table "policy-rules", keeps a selector
// cache (each peer selector and the identities it selects), and writes the
// desired policy of every local endpoint into "policy-entries" (the allows)
// and "policy-enforcement" (whether the endpoint is isolated in each
// direction), which the policy-maps reconciler writes into BPF maps.
//
// The contract:
//
//   - Semantics are those of networking.k8s.io/v1 NetworkPolicy. A pod is
//     isolated in a direction once a policy with that type selects it;
//     policyTypes default as the API server defaults them (Ingress, plus
//     Egress when there are egress rules); policies add up. An endpoint
//     isolated for ingress always allows the host identity (the node's
//     probes, host-network pods). See docs/cells/policy.md for ipBlock,
//     named ports and the label filter.
//   - Peers are matched against identities (cells/identity): a pod
//     identity's labels, its namespace and its namespace's labels, with
//     kubernetes.io/metadata.name put back from the namespace's name. The
//     pods a policy applies to are matched on their endpoint's own labels.
//   - Nothing is written until the NetworkPolicies, identities, endpoints
//     and the cluster's pods are listed; both output tables are initialized
//     after the first complete computation.
//   - Changes are incremental: a new or vanished identity rewrites only
//     the entries of that identity of the endpoints whose policies'
//     selectors changed; a policy, endpoint or pod change recomputes the
//     endpoints concerned. Only rows that differ are written (with
//     reconciler.StatusPending()); a recompute that changes nothing writes
//     nothing.
//   - Make before break: an endpoint's new entries are inserted before its
//     stale ones are deleted, and the reconciler writes the maps in that
//     (revision) order, so traffic that the policy allows before and after
//     a change passes throughout, also while an agent killed half way
//     through is down.
//   - A NetworkPolicy the agent cannot apply (a selector it cannot parse,
//     an endPort below port, an unknown protocol, a bad CIDR) is named, with
//     what is wrong, in the module's health and the log, and changes
//     nothing: the last version that could be applied stays in force.
//     Deleting a policy ends its enforcement.
//   - The policy revision is the revision of the table "policy-rules": it
//     grows with every NetworkPolicy change. An Enforcement row carries the
//     revision at which the endpoint's policy last changed.
package policy
