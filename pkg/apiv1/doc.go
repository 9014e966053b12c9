// Package apiv1 holds the request and response types of the agent's REST API,
// version 1, and the paths they are served on.
//
// The agent serves the API over a unix socket (the api cell, --api-socket).
// The types here are the contract between that server, the agent's client
// commands (pkg/client) and the CNI plugin: a field added here is added for
// all of them. The package has no dependency on hive or on any cell, so a
// small binary can import it without linking the agent.
//
// Every error response has the body of [Error] and a 4xx or 5xx status.
package apiv1
