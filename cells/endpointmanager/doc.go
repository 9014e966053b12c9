// Package endpointmanager manages the node's endpoints: one per pod, a veth
// pair between the host and the pod's network namespace, with an address
// per pod pool. The CNI plugin (cmd/cellium-cni) asks for them over the API
// (PUT and DELETE /v1/endpoints/container-id:<id>).
//
// The contract:
//
//   - Creating an endpoint allocates its addresses (ipam), writes its state
//     file as "creating", makes the veth pair (host side lxc<hash>, see
//     [HostIfName]; pod side CNI_IFNAME), the pod's address and routes
//     (the router address on the link, the default route through it) and
//     the router address on the host side; inserts the endpoint in the
//     table as Starting and waits until it is live, every LiveCondition
//     that other cells contribute holding (in the endpoint map, programs
//     attached, its network policy in the maps); only then adds the host's
//     route to the pod, so that nothing reaches a pod before its policy
//     does, writes the state file as "ready" and answers. An endpoint
//     reported to the runtime is on disk and live; what a failed creation
//     made is undone before the error is returned.
//   - One state file per endpoint, <state-dir>/endpoints/<id>/endpoint.json,
//     written atomically (pkg/statefile). It is the source of truth across
//     restarts; the table "endpoints" is rebuilt from it.
//   - Operations on one container (ADD, DEL, identity changes) are
//     serialized by the container's lock, in the order they came; those of
//     different containers run at once, with short critical sections for
//     what they share (endpoint ID, address, table row). The restore holds
//     the whole manager. The pod's netns path (the caller's) is opened
//     before any lock is taken, never blocking on it (only a regular file
//     is opened, non-blocking, within 5 s); waiting for a lock ends with
//     the caller's context (ErrBusy). One stuck request fails alone.
//   - Deleting is idempotent: a container the agent knows nothing about is
//     ErrNotFound, which the plugin takes as done; leftovers of a creation
//     the agent did not finish are removed. The state file says "deleting"
//     first; a DEL that fails half way leaves the endpoint "deleting" with
//     the error until a retried DEL (or a restart) finishes it.
//   - At start a job restores every endpoint on disk, holding three
//     barriers named "endpoint-restore": an IPAM restorer (no new address is
//     handed out before every restored one is claimed), an initializer of
//     the endpoints table (the endpoint map is pruned only after it), and a
//     readiness barrier (the agent is not ready before it). Creations and
//     deletions wait for it; a pod's creation also waits until the pods
//     of the node are listed and, with a real API server, until the watch
//     has brought the pod and its namespace (its labels make its identity
//     and policy). Temporary files are removed, state files that
//     do not parse or are not regular files are moved to
//     <state-dir>/endpoints-invalid/ with a log line, endpoints still
//     "creating" are undone and those "deleting" deleted, endpoints whose
//     netns is gone are removed and their addresses released, and the rest
//     are checked against the kernel and fixed where they differ, without
//     disturbing a pod whose interfaces are intact. A host side made again
//     (or found down) stays down and unrouted, the endpoint starting, until
//     it is live, as a creation's does; then it is routed and ready. The
//     wait holds no lock: the container's DEL goes ahead (and ends it), a
//     retried ADD is answered ErrExists at once; only the routing takes
//     the container's lock. One not live within
//     --endpoint-restore-live-report (30s) is shown, with what it waits
//     for, in the health row endpoint-manager.restore-live, which says OK
//     once none waits. An address whose owner
//     still has its veth pair is never released, also when its state file
//     was lost: it is claimed for that container until its DEL. What the
//     restore could not use is the health row endpoint-manager.state.
//
// A ready endpoint's host route deleted (or written over) behind the
// agent's back is put back at once, following the netlink route updates,
// with the container's lock held, and logged and counted
// (cellium_kernel_repairs_total{module="endpoint-manager"}); every ready
// endpoint's host routes are compared with the kernel every 30 minutes,
// which writes nothing when they are there.
//
// --endpoint-test-crash-at, a hidden flag, kills the agent at a named step
// of every creation: crash tests use it to stop the agent in the middle of
// a CNI ADD.
//
// At start, once the API serves, the agent writes its CNI configuration,
// 05-cellium.conflist, to --cni-conf-dir, naming its API socket.
//
//	ep, err := m.Create(ctx, endpointmanager.CreateRequest{
//		ContainerID: "3f2a", Netns: "/var/run/netns/cni-1", IfName: "eth0",
//	})
//	// ep.IPv4 == 10.244.0.2, ep.HostIfName == "lxc..." ; later:
//	_, err = m.Delete(ctx, endpointmanager.Selector{ContainerID: "3f2a"})
package endpointmanager
