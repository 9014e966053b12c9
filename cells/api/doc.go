// Package api is the agent's REST API: JSON over HTTP on a unix socket
// (--api-socket, mode 0660).
//
// The server has no list of handlers. A cell contributes its own routes by
// returning [Routes] from a constructor; the server collects the
// "api-routes" value group when it is built, so the API depends on every
// cell that contributes to it, and a route is served from the moment the
// socket accepts connections:
//
//	func healthRoutes(r *Readiness) api.Routes {
//		return api.NewRoutes(api.Route{
//			Method: "GET", Path: apiv1.PathHealthz,
//			Handler: func(*http.Request) (any, error) { return r.Status(), nil },
//		})
//	}
//
// A handler returns the value to encode as JSON, or an error. Errors made
// with [BadRequest], [NotFound] or [Errorf] carry their HTTP status; any
// other error is a 500. Every error reaches the client as apiv1.Error.
// Requests that name no route get a JSON 404 (or 405 when only the method is
// wrong). A handler that panics is logged and answered with a 500; the agent
// keeps running.
//
// A route may stream instead: with a [StreamFunc] in Route.Stream it answers
// with newline-delimited JSON values for as long as the client stays (a
// live feed such as GET /v1/monitor). Stopping the agent ends every stream.
//
// Request and response types live in pkg/apiv1 and the typed client in
// pkg/client, so client commands and the CNI plugin share them.
package api
