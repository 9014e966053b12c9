// Package endpointmaps keeps the BPF endpoint map, cellium_endpoints, equal
// to the endpoints table: for every address of every ready endpoint, the
// endpoint's ID, the ifindex of its host-side interface and the MACs of both
// ends of its veth pair. The datapath looks an address up there to know
// whether it is a local pod and where to deliver to it.
//
// The map is declared through the bpf-maps registry, so it is pinned and
// survives agent restarts: while the agent is down, and while it restores,
// the datapath keeps the entries it had. The statedb reconciler writes each
// endpoint's entries when its row changes (reconciler status in the row's
// MapStatus: `agent db show endpoints`), deletes them when the row goes,
// and prunes entries that no endpoint has. Pruning waits until the
// endpoints table is initialized, which the endpoint manager's restore
// completes: entries of endpoints that are about to be restored are never
// removed.
//
// Layout (little endian, as the datapath reads it):
//
//	key   EndpointKey  { addr [16]u8 (IPv4 in the first 4 bytes), family u8 (4 or 6), pad [3]u8 }
//	value EndpointInfo { ifindex u32, endpoint_id u16, pad [2]u8, mac [6]u8, host_mac [6]u8 }
package endpointmaps
