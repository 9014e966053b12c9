// Package devices keeps two StateDB tables current from netlink: "devices",
// every network device of the agent's network namespace with its addresses,
// and "node-addresses", the addresses other hosts reach this node at.
//
// Contract:
//
//   - Both tables are read-only for everyone else; this cell is their only
//     writer. It provides statedb.Table[*Device] and
//     statedb.Table[*NodeAddress].
//   - Neither table is initialized until the first complete listing of
//     links and addresses is in it. Once initialized, a missing row means
//     the device or address does not exist (as of the last update).
//   - A device is selected when it is administratively up, is not
//     loopback, is not one of the agent's own veths (lxc*, cellium*), and,
//     if --devices is set, matches one of its names or globs.
//   - node-addresses holds the global unicast addresses (no loopback,
//     link-local or multicast, and of global scope) of selected devices,
//     one row per address. Primary marks the first such address of its
//     family on its device, in the kernel's order: for IPv4 the oldest
//     primary address, for IPv6 the newest. The kernel's order is kept
//     through updates, so an agent that restarts picks the same primaries.
//   - Changes are written in batches: whatever updates are queued go into
//     one write transaction, and a row is rewritten only if it changed, so
//     a watch channel closes only for a real change.
//
// A job subscribes to link and address updates, then lists everything, and
// applies the updates that follow. If a subscription fails (the kernel
// dropped updates because the agent fell behind, say), the module's health
// is Degraded with the error, and the job starts over: subscribe, list, and
// replace the tables' contents, deleting rows of devices that went away
// meanwhile.
//
// A consumer, such as the load balancer creating NodePort frontends on every
// node address, waits for the table to be initialized and follows it with
// watch channels:
//
//	for {
//		txn := db.ReadTxn()
//		if ok, init := nodeAddrs.Initialized(txn); !ok {
//			<-init
//			continue
//		}
//		addrs, watch := nodeAddrs.AllWatch(txn)
//		reconcileFrontends(addrs)
//		<-watch
//	}
package devices
