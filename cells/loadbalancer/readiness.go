package loadbalancer

import (
	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/health"
)

// K8sSyncedBarrier is the readiness barrier that waits for the first
// LIST of Services and of EndpointSlices (in manifests mode: the
// manifests loaded).
const K8sSyncedBarrier = "k8s-synced"

func k8sSynced(db *statedb.DB, t *lbTables) health.WaitOut {
	return health.TablesInitialized(K8sSyncedBarrier, db, t.services, t.backends)
}
