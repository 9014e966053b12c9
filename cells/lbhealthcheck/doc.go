// Package lbhealthcheck is the lb-healthcheck cell: the health check node
// ports of Services with externalTrafficPolicy: Local, served as kube-proxy
// serves them, so that an external load balancer sends a Service's traffic
// only to the nodes that have one of its endpoints.
//
// The contract:
//
//   - A Service of type LoadBalancer or NodePort with externalTrafficPolicy
//     Local and a spec.healthCheckNodePort (the loadbalancer cell's
//     [loadbalancer.Service.HealthCheckNodePort]) gets an HTTP listener on
//     that TCP port, at --health-check-nodeport-bind-address (all addresses
//     by default). The listener opens once the services and backends tables
//     are initialized, moves when the port changes and closes when the
//     Service goes or stops qualifying.
//   - GET (or any method) on any path answers with the Service's name and
//     its number of local endpoints: the distinct addresses of its active
//     (ready), unquarantined backends whose EndpointSlice names this node.
//     200 when there is at least one, 503 when there is none, with
//     Content-Type: application/json, X-Content-Type-Options: nosniff,
//     X-Load-Balancing-Endpoint-Weight: N and the body below, as
//     kube-proxy answers (the agent answers only while it runs, so
//     serviceProxyHealthy is always true).
//   - A port that cannot be bound (in use, or taken by another Service) is
//     an error in the cell's health naming the Service and the port, and is
//     retried; the other Services' ports keep serving.
//   - --enable-health-check-nodeport=false serves nothing.
//
// The body of a Service with one local endpoint:
//
//	{"service":{"namespace":"shop","name":"web"},"localEndpoints":1,"serviceProxyHealthy":true}
package lbhealthcheck
