package ipcache

import (
	"net/http"
	"net/netip"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

func apiRoutes(db *statedb.DB, tbl statedb.Table[*Entry]) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathIPCache, Handler: func(*http.Request) (any, error) {
			out := []apiv1.IPCacheEntry{}
			for e := range tbl.All(db.ReadTxn()) {
				out = append(out, apiEntry(e))
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathIPCache + "/{ip}", Handler: func(r *http.Request) (any, error) {
			addr, err := netip.ParseAddr(r.PathValue("ip"))
			if err != nil || addr.Zone() != "" {
				return nil, api.BadRequest("invalid address %q: want an IPv4 or IPv6 address without zone", r.PathValue("ip"))
			}
			e, found := Lookup(db.ReadTxn(), tbl, addr)
			if !found {
				return nil, api.NotFound("no ipcache prefix holds %s", addr)
			}
			return apiEntry(e), nil
		}},
	)
}

func apiEntry(e *Entry) apiv1.IPCacheEntry {
	w := e.Winner()
	out := apiv1.IPCacheEntry{
		Prefix: e.Prefix.String(), Identity: uint32(w.Identity), Source: w.Source.String(),
		Namespace: w.Namespace, PodName: w.PodName, Status: e.Status.String(),
	}
	if w.HostIP.IsValid() {
		out.HostIP = w.HostIP.String()
	}
	for _, c := range e.Claims[1:] {
		out.Shadowed = append(out.Shadowed, c.Source.String())
	}
	return out
}
