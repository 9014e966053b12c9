package api

import "github.com/cilium/hive/cell"

// Cell serves the agent's REST API on --api-socket.
var Cell = cell.Module(
	"api",
	"REST API over a unix socket",

	cell.Config(DefaultConfig),
	cell.Provide(newServer, introspectionRoutes),
	// Nothing else depends on the server: force it into the graph.
	cell.Invoke(func(*Server) {}),
)
