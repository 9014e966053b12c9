// Package clusterhealth tells whether this node reaches every node of the
// cluster, through the node's address and through the pod network.
//
// The contract:
//
//   - Every agent serves GET /hello on --cluster-health-port (4240) on
//     every address of its node, and on its health endpoint.
//   - The health endpoint is a network namespace bind-mounted at
//     <state-dir>/health.netns (it outlives the agent) with an endpoint in
//     it, made and restored by the endpoint manager like a pod's, with the
//     reserved identity health (4). Its addresses are the node's health IPs
//     (published through the nodes table). It is made again when it goes
//     (its row deleted) or when the endpoint manager's check finds it
//     damaged (every 5 s).
//   - Each round probes every node, this one included: ICMP and HTTP to its
//     address, HTTP to its health endpoint, so a broken tunnel or route
//     shows even while the hosts reach each other. The interval is
//     max(--cluster-health-interval, nodes x 40ms); a round's probes are
//     spread over it and each is bounded by its share of it (2 s at most),
//     so a round never takes longer than its interval. The results replace
//     the table "node-health" in one transaction; nodes that left lose
//     their rows and their metrics.
//   - The module is Degraded when there are other nodes and none is
//     reachable, naming the paths that failed.
package clusterhealth
