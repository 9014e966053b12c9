// Package nodes keeps the table "nodes": this node and every other node of
// the cluster, with the addresses other nodes reach it at, its pod CIDRs
// and its health endpoint's addresses.
//
// The contract:
//
//   - Sources claim nodes: this agent its own node (SourceLocal: its name
//     from --node-name, its addresses from --node-ip or the device holding
//     the default route, its pod CIDRs from the IPAM), Kubernetes Node
//     objects (SourceK8s), and with --kvstore=etcd the nodes/v1/<name> keys
//     agents publish (SourceKVStore). A row is the strongest source's
//     description: local > k8s > kvstore; what it leaves empty (addresses,
//     pod CIDRs, health IPs) a weaker source may fill.
//   - What cannot be used is left out of a row and said in its Problems: a
//     node without address is listed but unreachable; a pod CIDR that
//     overlaps one another node has a stronger claim on is dropped (a
//     route for it would take another node's pods). The claims, strongest
//     first: this node's; one its Node object gives a node; the node that
//     held the CIDR until now; the node whose name sorts first. A key
//     cannot take a CIDR another node holds. Invalid values of a Node
//     object are logged and ignored; a bad key is refused (logged, named
//     in health, what it said before taken back); nothing else is
//     affected.
//   - The table is initialized once this node is known, the Node objects
//     are synced and (with the kvstore) the node keys are listed, in the
//     transaction that writes the rows of those claims: consumers that
//     remove what the table does not have (routes, ipcache entries) wait
//     for it, and never see it initialized without them.
//   - This node is published to the kvstore as a leased key, written back
//     on its lease if someone else deletes or changes it (logged, counted).
//   - On its Node object the agent keeps the annotations
//     network.cellium.io/pod-cidrs and /health-ips, and those other cells
//     contribute (group "node-annotations"), patching only when they differ;
//     once the agent is ready it sets the condition NetworkUnavailable=False
//     (reason CelliumIsUp) and removes the taint
//     node.cellium.io/agent-not-ready.
package nodes
