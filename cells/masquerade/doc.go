// Package masquerade makes pod traffic that leaves the cluster carry the
// node's address: from the nodes table it computes the table "masquerade"
// (rows of role source or excluded, each a prefix with the reasons it is
// there), which a reconciler writes into the agent's own nftables table.
//
// The contract:
//
//   - --enable-masquerade (default true): a packet from one of this node's
//     pod CIDRs to an address outside every node's pod CIDRs, every node's
//     addresses and --native-routing-cidr leaves with the address of the
//     device it leaves through (nftables masquerade, keeping the pod's
//     source port when it is free). Pod to pod and pod to node keep the
//     pod's address.
//
//   - The kernel state is one table, inet cellium: a nat chain postrouting
//     (priority srcnat, policy accept), interval sets pods4/pods6 (the
//     sources) and nomasq4/nomasq6 (the exclusions; prefixes merged so that
//     none overlap or touch), and one rule per family. The table is the
//     agent's alone: what in it the rows do not ask for is removed. It
//     exists whenever masquerade is enabled, its source sets empty when
//     this node has no pod CIDR: without a nat chain the kernel stops
//     translating the connections it masqueraded.
//
//   - Every write compares with the kernel first and changes only what
//     differs (a set's elements are replaced in one transaction); a restart
//     writes nothing when the table is right. Nothing is written before the
//     nodes table is initialized.
//
//   - Drift is put back without a restart: a change to the agent's table
//     (or a set element change, which names no table) seen by an nftables
//     monitor has the reconciler prune, which compares the whole table and
//     writes back what differs; each repair is logged and counted
//     (cellium_kernel_repairs_total{module="masquerade",object="nft"}).
//
//   - Port clashes and NAT state are the kernel's: conntrack picks a free
//     source port for each new connection, and its entries expire with the
//     connections (no agent GC). The table stays when the agent stops, so
//     established masqueraded connections outlive a restart; `agent
//     cleanup` removes it (Remove), and --enable-masquerade=false makes the
//     running agent remove it.
//
//   - The table lives in the namespace of --devices-netns (the agent's own
//     by default), as the routing cell's routes do.
//
// Example:
//
//	rows := masquerade.Desired(nodesTable.All(txn), native) // sources and exclusions
//	changed, err := masquerade.NewKernel(-1).Sync(masquerade.RulesetOf(rowsTable.All(txn)))
package masquerade
