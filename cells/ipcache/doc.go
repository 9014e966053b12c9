// Package ipcache maps address prefixes to security identities, for the
// datapath (the LPM-trie BPF map cellium_ipcache, layout in pkg/ipcachemap)
// and for anyone who must name an address (`agent ipcache get`, Hubble).
//
// The contract:
//
//   - The table "ipcache" has one row per prefix holding every source's
//     claim on it, strongest first: local endpoint > reserved (this node's
//     addresses as host, 0.0.0.0/0 and ::/0 as world) > kvstore (other
//     nodes' pods, ip/v1) > k8s > node (other nodes' addresses as
//     remote-node, their pod CIDRs as world behind them) > restored. The
//     map gets the strongest;
//     when it goes, the next one takes over.
//   - Each source is level-triggered: a job recomputes the source's claims
//     from what it follows (the endpoints table, the node-addresses table,
//     the nodes table, the kvstore's ip/v1 keys) and applies the difference. Each has a
//     table initializer, done once its input is complete.
//   - At start the pinned map is read back as restored claims, so the
//     datapath keeps the identities it had; they are dropped, and what no
//     other source claims leaves the map, only once every initializer is
//     done. The reconciler writes nothing that is already right.
//   - With the kvstore, this node's endpoint addresses are published as
//     leased ip/v1 keys, and deleted when the endpoint goes; a key of ours
//     that someone else deletes or changes is written back on its lease
//     (logged, counted). An ip/v1 key that is not a pod's address in
//     canonical form, or whose value breaks the bounds, is refused: logged,
//     named in health, and its earlier claim taken back.
package ipcache
