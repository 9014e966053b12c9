// Package k8sendpoints writes this node's pods as CelliumEndpoint objects
// (pkg/k8sapi) and keeps every other node's in the table "k8s-endpoints",
// which the ipcache follows (source k8s), in the crd identity mode.
//
// The contract (docs/cells/k8s-endpoints.md):
//
//   - One object per pod of this node with a resolved identity, named and
//     namespaced as the pod and owned by it; created once, updated only
//     when what it says changes, deleted when the pod's endpoint is gone
//     (also at start, once the endpoints are restored, and on each resync).
//   - The table holds the valid objects of other nodes: a cluster identity
//     known and of the object's namespace (or init, health), a known node,
//     addresses within that node's pod CIDRs and no node's address. Bad
//     ones are logged, named in the health of scope "refused", counted
//     (cellium_k8s_endpoints_refused_total) and ignored; a node's or
//     identity's change checks its objects again.
//   - Outside crd mode nothing runs and the table is empty.
package k8sendpoints
