// Package loadbalancer is the load balancer's control plane: it turns
// Kubernetes Services and EndpointSlices, and the node's addresses, into
// desired state in three StateDB tables, which the lb-maps reconciler
// programs into the datapath.
//
//   - services: a row per Service ([Service]), in compact form.
//   - backends: a row per EndpointSlice ([SliceBackends]): the backends
//     ([Backend], address:port/protocol, port name, state, node) it lists
//     for its service, by "namespace/service/slice" ([BackendsBySlice]); a
//     service's rows share the prefix of its name ([BackendsOf]).
//   - frontends: a row per address the datapath load-balances ([Frontend]):
//     every ClusterIP, ExternalIP and LoadBalancer ingress IP of every
//     service port, and its NodePort on every node address and on the
//     wildcard address. ExternalName and headless services have none.
//     They are indexed by address; the NodePort ones also by service
//     ([FrontendNodePortsByService]), the others are at the addresses the
//     service's row names ([FrontendsOf]).
//
// Each index entry costs about 100 bytes, and each table has a revision
// index besides: a secondary index is kept only where nothing else
// answers the question (see docs/performance.md).
//
// # Contract
//
// A frontend carries everything the datapath needs, its backends already
// chosen: those of the service port with the same name and protocol and the
// frontend's address family; with traffic policy Local (internal for
// ClusterIP, external for the rest) only those on this node; the active ones,
// or when none is active the terminating ones; never a quarantined one;
// sorted by address. No backend means the datapath rejects connections.
//
// A frontend row is written only when its content changes, and every write
// sets its status Pending. A frontend that did not change keeps its row and
// status: a relist, or the relist after an agent restart, of objects that did
// not change writes nothing.
//
// Each table has initializers ([InitK8sServices], [InitK8sEndpointSlices],
// and for frontends also [InitNodeAddresses]), so a table that is
// initialized is complete, and a reconciler may prune against it: the
// services and backends tables' are done in the write transaction that
// applies the end of the initial listing, the frontends table's in the one
// that writes the frontends of the last listed service. Frontends are
// computed only once both listings are in: a service without its endpoints
// would otherwise reject connections, briefly, on every restart.
//
// The reflectors keep no copy of any Kubernetes object. A client-go Reflector
// hands each object to a store that converts it to its compact form at once
// and queues it (a listing as one event per object and one for its end; a
// listing is converted and queued as the list call reads it, a page or an
// object at a time, never held whole: see streamList and pagedList); a
// job applies the queue in batches, one write transaction for up to 1024
// events, and the frontends of up to 1024 services. No transaction holds the
// tables for long, however large the cluster: the lb-maps reconciler
// proceeds beside a listing of 50,000 Services, and stopping does not wait
// for one (a batch is abandoned when the agent stops).
//
// An invalid field (an IP address that does not parse, a port out of range)
// is skipped with a warning naming the object and field, and the cell's
// health (scope k8s-objects) is degraded with the same message; the rest of
// the object and every other object apply. Health recovers when the object
// is fixed or deleted. An address two services claim stays with the one
// that had it first; the other gets it once the first lets go.
//
// A backend health checker takes a backend out of service with
// [BackendHealth].
//
// # Example
//
// The lb-maps reconciler registers on the frontends table:
//
//	func register(p reconciler.Params, frontends statedb.RWTable[*loadbalancer.Frontend], ops *ops) error {
//		_, err := reconciler.Register(p, frontends,
//			(*loadbalancer.Frontend).Clone, (*loadbalancer.Frontend).SetStatus, (*loadbalancer.Frontend).GetStatus,
//			ops, nil)
//		return err
//	}
package loadbalancer
