package bpfmaps

import (
	"net/http"
	"strings"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// apiRoutes lists the registry: GET /v1/maps and GET /v1/maps/{name}.
func apiRoutes(r *Registry) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathMaps, Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			return r.list(), nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathMaps + "/{name}", Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			name := req.PathValue("name")
			m, ok := r.lookup(name)
			if !ok {
				return nil, api.NotFound("no bpf map %q; maps: %s", name, strings.Join(r.names(), ", "))
			}
			return m, nil
		}},
	)
}
