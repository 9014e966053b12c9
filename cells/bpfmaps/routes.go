package bpfmaps

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// apiRoutes lists the registry: GET /v1/maps, GET /v1/maps/{name} and
// GET /v1/maps/{name}/entries.
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
		api.Route{Method: http.MethodGet, Path: apiv1.PathMaps + "/{name}/entries", Handler: func(req *http.Request) (any, error) {
			q, err := api.QueryParams(req, "limit")
			if err != nil {
				return nil, err
			}
			limit := 0
			if s := q.Get("limit"); s != "" {
				if limit, err = strconv.Atoi(s); err != nil || limit < 0 {
					return nil, api.BadRequest("invalid limit %q: want a non-negative number of entries (0: all)", s)
				}
			}
			name := req.PathValue("name")
			p, ok := r.pinned(name)
			if !ok {
				return nil, api.NotFound("no bpf map %q; maps: %s", name, strings.Join(r.names(), ", "))
			}
			entries, truncated, err := p.dump(limit)
			if err != nil {
				return nil, err
			}
			if entries == nil {
				entries = []apiv1.MapEntry{}
			}
			return apiv1.MapDump{Map: p.describe(), Entries: entries, Truncated: truncated}, nil
		}},
	)
}
