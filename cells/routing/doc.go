// Package routing makes the pods of other nodes reachable: from the nodes
// table it computes the routes to their pod CIDRs, and in tunnel mode the
// neighbor and VXLAN forwarding entries behind them, as three StateDB
// tables ("routes", "neighbors", "fdb") that reconcilers write through
// netlink.
//
// The contract:
//
//   - --routing-mode=tunnel (default): a VXLAN device, cellium_vxlan (UDP
//     --tunnel-port, VNI 2, no learning), made once there is another node
//     to reach, carries pod traffic between node addresses. Each node's
//     VTEP MAC is derived from its address, so no node needs another's to
//     be told: a remote pod CIDR is routed onlink
//     through the device to its first address, whose permanent neighbor
//     entry is the remote VTEP's MAC, whose FDB entry is the remote node's
//     address. The device's MTU is the underlay's less the encapsulation
//     (50 bytes over IPv4, 70 over IPv6); Config.Overhead gives the same to
//     the pods.
//   - --routing-mode=native: a route per remote pod CIDR via the node's
//     address of the CIDR's family (nodes on one L2 segment, as
//     --auto-direct-node-routes did).
//   - Routes carry protocol RouteProtocol (201): the reconciler prunes its
//     own that the table lacks, never anyone else's. Neighbor and FDB
//     entries are pruned on the tunnel device only.
//   - Nothing is written before the nodes table is initialized (every
//     source synced), so a restart prunes nothing that is still wanted;
//     each write compares with the kernel first, so a restart rewrites
//     nothing that is right. Routes stay when the agent stops: traffic
//     flows while it is down.
//   - Drift is put right without a restart: the tunnel device made again
//     or set up again after someone removed it or set it down, or any
//     device seen going down and up (netlink link updates), has every row
//     on it refreshed; a route of the agent's, or a neighbor or fdb
//     entry of the tunnel device, deleted or written over (netlink route
//     and neighbour updates) has its row refreshed. A refreshed row is
//     compared with the kernel and written only if the kernel differs;
//     each object put back is logged and counted
//     (cellium_kernel_repairs_total{module="routing"}).
//   - A node that leaves takes its rows, and so its kernel entries, away.
//   - The routing mode is annotated on this node's Node object.
package routing
