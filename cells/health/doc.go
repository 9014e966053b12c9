// Package health is the agent's health and readiness.
//
// Health. Every module reports through hive's cell.Health: jobs and
// reconcilers do it on their own, cells may add scopes of their own. This
// package provides the cell.Health the whole graph uses, backed by the StateDB
// table "health": one row per module or scope, keyed by its dotted path
// ("sysctl.job-reconcile"). The agent's hive options scope it per module
// ([ModuleDecorators]), so a module's reports land under its own id. A row
// holds the latest level (OK, Degraded, Stopped, Unknown), message, error and
// the time the level last changed. A scope that never reported is Unknown.
// Because it is a table, "what is unhealthy?" is a query: `agent status`,
// GET /v1/health, `agent db show health`.
//
// Readiness. The agent is ready when every cell has started and every
// readiness barrier is done. A cell that must finish something before the node
// may take traffic (restoring endpoints, a first sync) adds a barrier in its
// constructor and calls the returned function when it is done:
//
//	func newRestorer(r *health.Readiness, ...) *restorer {
//		done := r.Add("endpoint-restore")
//		... // in a job, after the restore:
//		done()
//	}
//
// Barriers are rows of the StateDB table "readiness". A job that must wait
// for readiness calls [Readiness.Wait]. The barrier
// "cells-started" is done by [StartedMarker], which must be the last cell of
// the hive so that its start hook runs after every other one.
//
// Probes. --health-addr serves /healthz (200 once every cell has started) and
// /readyz (200 once ready) for kubelet probes, plus the routes other cells
// contribute to the "health-routes" value group (/debug/pprof/ with
// --pprof). Its default, 127.0.0.1:9879, keeps it on the node: the kubelet
// probes loopback. /metrics has an address of its own (--metrics-addr).
package health
