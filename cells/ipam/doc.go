// Package ipam allocates pod addresses from the node's pod CIDRs and keeps
// every allocation across restarts and crashes of the agent.
//
// Pools. One pool per address family, from --pod-cidr (--ipam=static). In
// each, the first address after the network address is the router address:
// the host side of every endpoint answers for it and the pods' default
// route goes through it. Pods get the others, except the IPv4 broadcast.
//
// Allocation. [IPAM.Allocate] hands out the next free address of a family
// (searching on from the last one handed out, so a released address is not
// reused at once) or a given one, for an owner: the container ID of the
// endpoint. It writes the allocation to <state-dir>/ipam/<ip>.json
// atomically before it returns, so an address handed out for a CNI ADD
// that the agent did not finish is still known after a crash; synced,
// unless the owner keeps its own durable record of it ([Request.Recorded]:
// the endpoint's state file) and claims it from there. An exhausted
// pool is an [ErrExhausted] error that names the pool. Every allocation is
// a row of the StateDB table "ipam" (IP, owner, state, since).
//
// Restore. At start the IPAM loads the allocations on disk (removing the
// temporary files of interrupted writes and moving unreadable files to
// <state-dir>/ipam-invalid/). In-use allocations come back "unclaimed". A
// cell that restores owners (the endpoint manager) registers as a restorer
// from its constructor with [IPAM.RegisterRestorer], claims the address of
// every owner it restores with [IPAM.Claim], then calls done. Restorers are
// initializers of the ipam table, and Allocate waits until the table is
// initialized: a new owner can never get an address that a restored one
// holds, because allocation is not served before every restorer is done.
// That is an edge of the graph, not a delay: `agent db list` shows the
// table waiting for "endpoint-restore".
//
// Held releases. A cell that must act on an address before it is used
// again (the conntrack GC: the old pod's connections) calls
// [IPAM.HoldReleases] from its constructor. An address its owner then
// releases ([IPAM.ReleaseOwner]) stays in the table as "releasing", its
// file removed, handed to no one, until the holder calls
// [IPAM.FinishReleases]; [IPAM.Releasing] lists them with a watch channel.
//
// Leaks. An address that stays unclaimed belonged to an owner that never
// became an endpoint: the agent died in the middle of a CNI ADD, and the
// runtime did not call DEL. Once --ipam-leak-grace has passed after the
// restore, such addresses are released, each with a warning in the log.
// A restorer that knows an owner is still alive without its own record
// (the endpoint manager, for a pod whose state file was lost but whose
// veth pair exists; see [IPAM.Unclaimed]) claims them instead.
//
//	func newManager(i *ipam.IPAM, ...) *Manager {
//		m := &Manager{ipam: i, restored: i.RegisterRestorer("endpoint-restore")}
//		...
//	}
//	// In the restore job:
//	for _, ep := range endpointsOnDisk {
//		i.Claim(ep.IPv4, ep.ContainerID)
//	}
//	m.restored()
//	// Serving a CNI ADD; waits while a restore is running:
//	a, err := i.Allocate(ctx, ipam.Request{Owner: containerID, Family: ipam.IPv4})
package ipam
