package api

import "github.com/cilium/hive/cell"

// Cell serves the agent's REST API on --api-socket.
var Cell = cell.Module(
	"api",
	"REST API over a unix socket",

	cell.Config(DefaultConfig),
	cell.Provide(newServer, introspectionRoutes),
	cell.Invoke(serveAPI),
)

// serveAPI pulls the server into the graph: nothing depends on it.
func serveAPI(*Server) {}
