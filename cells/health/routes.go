package health

import (
	"net/http"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// apiRoutes serves health over the API socket: the probe answer and the tree.
func apiRoutes(db *statedb.DB, tbl statedb.Table[*Status], r *Readiness) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathHealthz, Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			hz, _ := r.Status()
			return hz, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathHealth, Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			return Snapshot(db, tbl, r), nil
		}},
	)
}

// Snapshot is the agent's health now, as a tree per module.
func Snapshot(db *statedb.DB, tbl statedb.Table[*Status], r *Readiness) apiv1.Health {
	var rows []*Status
	for st := range tbl.All(db.ReadTxn()) {
		rows = append(rows, st)
	}
	modules, worst := buildTree(rows)
	hz, _ := r.Status()
	return apiv1.Health{Healthz: hz, Level: string(worst), Modules: modules}
}
