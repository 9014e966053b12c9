package ipam

import (
	"errors"
	"net/http"
	"net/netip"
	"net/url"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// apiRoutes serves GET and POST /v1/ipam and DELETE /v1/ipam/{ip}.
func apiRoutes(i *IPAM) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathIPAM, Handler: func(r *http.Request) (any, error) {
			if _, err := api.QueryParams(r); err != nil {
				return nil, err
			}
			return i.Status(), nil
		}},
		api.Route{Method: http.MethodPost, Path: apiv1.PathIPAM, Handler: func(r *http.Request) (any, error) {
			if _, err := api.QueryParams(r); err != nil {
				return nil, err
			}
			var in apiv1.IPAMReserve
			if err := api.DecodeJSON(r, &in); err != nil {
				return nil, err
			}
			req, err := reserveRequest(in)
			if err != nil {
				return nil, err
			}
			a, err := i.Allocate(r.Context(), req)
			if err != nil {
				return nil, apiError(err)
			}
			return toAPI(a), nil
		}},
		api.Route{Method: http.MethodDelete, Path: apiv1.PathIPAM + "/{ip}", Handler: func(r *http.Request) (any, error) {
			if _, err := api.QueryParams(r); err != nil {
				return nil, err
			}
			ip, err := pathAddr(r.PathValue("ip"))
			if err != nil {
				return nil, err
			}
			a, err := i.releaseByHand(ip)
			if err != nil {
				return nil, apiError(err)
			}
			return toAPI(a), nil
		}},
	)
}

// reserveRequest is the allocation a POST /v1/ipam body asks for, checked
// as Allocate checks it, so that what a body can say is tested alone
// (FuzzReserveBody).
func reserveRequest(in apiv1.IPAMReserve) (Request, error) {
	req := Request{Owner: in.Owner, Family: Family(in.Family), Reserved: true}
	switch {
	case in.IP != "" && in.Family != "":
		return Request{}, api.BadRequest("give either ip or family, not both")
	case in.IP != "":
		ip, err := netip.ParseAddr(in.IP)
		if err != nil || ip.Zone() != "" {
			return Request{}, api.BadRequest("invalid ip %q: want an address without a zone, such as 10.244.0.10", in.IP)
		}
		req.IP = ip.Unmap()
	case req.Family != IPv4 && req.Family != IPv6:
		return Request{}, api.BadRequest("invalid family %q: want %s or %s, or give an address", in.Family, IPv4, IPv6)
	}
	if err := validOwner(req.Owner); err != nil {
		return Request{}, apiError(err)
	}
	return req, nil
}

// pathAddr is the address of DELETE /v1/ipam/{ip}: one without a zone.
func pathAddr(value string) (netip.Addr, error) {
	// The mux leaves a "%" escaped in the value ("%25").
	raw, err := url.PathUnescape(value)
	if err != nil {
		raw = value
	}
	ip, err := netip.ParseAddr(raw)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, api.BadRequest("invalid address %q in the path: want an address without a zone, such as 10.244.0.10", raw)
	}
	return ip.Unmap(), nil
}

// apiError gives an IPAM error its HTTP status.
func apiError(err error) error {
	switch {
	case errors.Is(err, ErrInvalid):
		return api.BadRequest("%s", err)
	case errors.Is(err, ErrNotFound):
		return api.NotFound("%s", err)
	case errors.Is(err, ErrInUse):
		return api.Errorf(http.StatusConflict, "%s", err)
	case errors.Is(err, ErrExhausted), errors.Is(err, ErrNotReady):
		return api.Errorf(http.StatusServiceUnavailable, "%s", err)
	}
	return err
}

func toAPI(a *Allocation) apiv1.IPAMAllocation {
	return apiv1.IPAMAllocation{IP: a.IP.String(), Owner: a.Owner, State: string(a.State), Since: a.Since}
}

// Status is the pools and every allocation, as GET /v1/ipam answers.
func (i *IPAM) Status() apiv1.IPAM {
	txn := i.db.ReadTxn()
	init, _ := i.tbl.Initialized(txn)
	out := apiv1.IPAM{
		Mode:        i.mode,
		Ready:       init,
		Pending:     i.tbl.PendingInitializers(txn),
		Pools:       []apiv1.IPAMPool{},
		Allocations: []apiv1.IPAMAllocation{},
	}
	for _, p := range i.Pools() {
		out.Pools = append(out.Pools, apiv1.IPAMPool{
			Family: string(p.Family), CIDR: p.CIDR.String(), Router: p.Router.String(),
			Size: p.Size(), Used: i.used(txn, p),
		})
	}
	for a := range i.tbl.All(txn) {
		out.Allocations = append(out.Allocations, toAPI(a))
	}
	return out
}

// used counts the allocations in the pool.
func (i *IPAM) used(txn statedb.ReadTxn, p Pool) uint64 {
	var n uint64
	for a := range i.tbl.LowerBound(txn, AllocationIP.Query(p.first())) {
		if !p.Contains(a.IP) {
			break
		}
		n++
	}
	return n
}
