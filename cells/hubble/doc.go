// Package hubble is the hubble cell: it turns the monitor's datapath events
// into Hubble flows (github.com/cilium/cilium/api/v1/flow), keeps the
// newest in a ring, and serves them with the Hubble Observer API over gRPC,
// so that the upstream `hubble` CLI and `agent observe` can read them.
//
// The contract:
//
//   - Every trace, drop and socket-translation event the monitor delivers
//     becomes one flow, stamped with the node's name and the event's time,
//     enriched from the agent's tables as they are when the flow is made:
//     the local endpoint (ID, pod, namespace, labels "k8s:key=value") at
//     either address, and the service whose frontend is the address and
//     port. Agent notifications become agent events (GetAgentEvents).
//   - The ring keeps exactly --hubble-buffer-size flows (default 4095);
//     writers never wait for readers. A GetFlows follower that falls behind
//     by more than the ring is told how many it missed
//     (LostEvent HUBBLE_RING_BUFFER).
//   - Events lost on the way are recorded among the flows, where the gap
//     is: those the datapath could not write into its ring buffer
//     (PERF_EVENT_RING_BUFFER, from its lost counter, checked every second)
//     and those the cell's queue at the monitor could not take
//     (OBSERVER_EVENTS_QUEUE). Lost-event records pass every filter.
//   - GetFlows: the last (or first) number flows in a since/until window
//     that pass the allow list and none of the deny list, then with follow
//     every new one. A filter field this server cannot evaluate is an
//     InvalidArgument error naming it, never silently ignored. The response
//     headers are sent once the call has its place in the ring: after a
//     client's Header() returns, every flow added reaches a follower.
//   - ServerStatus: flows held, capacity, flows seen since start, uptime,
//     and the rate over the last minute. The gRPC health service reports
//     SERVING for observer.Observer and hubble.server.Observer while the
//     server runs.
//   - The Peer service (peer.Peer/Notify), for hubble-relay: a stream
//     first announces every node of the nodes table that has an address,
//     as "<node-ip>:<peer port>" (one port for all nodes: --hubble-peer-port,
//     else this agent's TCP port, else 4244), then PEER_ADDED,
//     PEER_UPDATED and PEER_DELETED as the table changes. A node without
//     address is never announced.
//   - The server listens on --hubble-listen-address: hubble.sock in
//     --run-dir by default (a stale socket is replaced, a live one or a
//     file is an error), another unix socket, or host:port for TCP; and,
//     with --hubble-tcp-listen-address, on a TCP address as well. Its
//     start hook listens; its stop hook ends follow and Notify streams,
//     waits for calls in flight and removes the socket.
//   - TCP is TLS (1.3): --hubble-tls-cert-file and --hubble-tls-key-file,
//     read again whenever they change (each handshake and every second
//     look), a bad change keeping the last good pair (health hubble.tls
//     Degraded); with --hubble-tls-client-ca-files only clients with a
//     certificate those CAs signed are served. Plaintext TCP only with
//     --hubble-disable-tls, logged as a warning; a TCP address with
//     neither is a start error. The unix socket is never TLS. With TLS,
//     the Peer service announces each node's TLSServerName.
//
// A client:
//
//	addr, _ := hubble.ListenAddress("", "/var/run/cellium")
//	conn, _ := hubble.Dial(addr)
//	stream, _ := observer.NewObserverClient(conn).GetFlows(ctx, &observer.GetFlowsRequest{Number: 20})
//	for resp, err := stream.Recv(); err == nil; resp, err = stream.Recv() {
//		fmt.Println(resp.GetFlow().GetSummary())
//	}
package hubble
