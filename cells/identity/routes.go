package identity

import (
	"net/http"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/identity"
)

func apiRoutes(db *statedb.DB, tbl statedb.Table[*Identity], a *Allocator) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathIdentityBackend, Handler: func(*http.Request) (any, error) {
			return a.Backend(), nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathIdentities, Handler: func(*http.Request) (any, error) {
			out := []apiv1.Identity{}
			for id := range tbl.All(db.ReadTxn()) {
				out = append(out, apiIdentity(id))
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathIdentities + "/{id}", Handler: func(r *http.Request) (any, error) {
			n, err := identity.Parse(r.PathValue("id"))
			if err != nil {
				return nil, api.BadRequest("%v", err)
			}
			id, _, found := tbl.Get(db.ReadTxn(), ByID.Query(n))
			if !found {
				return nil, api.NotFound("no identity %d", n)
			}
			return apiIdentity(id), nil
		}},
	)
}

func apiIdentity(id *Identity) apiv1.Identity {
	return apiv1.Identity{ID: uint32(id.ID), Kind: string(id.Kind), Source: string(id.Source), Labels: id.Labels.Strings(), Refs: id.Refs}
}
