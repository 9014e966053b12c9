package endpointmanager

import (
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/ipam"
	"github.com/cellium/cellium/pkg/apiv1"
)

// apiRoutes serves /v1/endpoints.
func apiRoutes(m *Manager) api.Routes {
	path := apiv1.PathEndpoints + "/{id}"
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathEndpoints, Handler: func(r *http.Request) (any, error) {
			q, err := api.QueryParams(r, apiv1.QueryCNI)
			if err != nil {
				return nil, err
			}
			var cniOnly bool
			switch v := q.Get(apiv1.QueryCNI); v {
			case "", "false":
			case "true":
				cniOnly = true
			default:
				return nil, api.BadRequest("invalid %s=%q: want true or false", apiv1.QueryCNI, v)
			}
			out := []apiv1.Endpoint{}
			for _, ep := range m.Endpoints() {
				// The health endpoint is the only one the agent makes
				// itself; every other came through PUT.
				if cniOnly && ep.Health {
					continue
				}
				out = append(out, m.toAPI(ep))
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: path, Handler: func(r *http.Request) (any, error) {
			s, err := selector(r)
			if err != nil {
				return nil, err
			}
			ep, found := m.Lookup(s)
			if !found {
				return nil, apiError(s.notFound())
			}
			return m.toAPI(ep), nil
		}},
		api.Route{Method: http.MethodGet, Path: path + "/check", Handler: func(r *http.Request) (any, error) {
			s, err := selector(r)
			if err != nil {
				return nil, err
			}
			ep, problems, err := m.Check(r.Context(), s)
			if err != nil {
				return nil, apiError(err)
			}
			return apiv1.EndpointCheck{Endpoint: m.toAPI(ep), Problems: problems}, nil
		}},
		api.Route{Method: http.MethodPut, Path: path, Handler: func(r *http.Request) (any, error) {
			s, err := selector(r)
			if err != nil {
				return nil, err
			}
			if s.ContainerID == "" {
				return nil, api.BadRequest("PUT %s/{id} takes %s<container ID>: the agent picks the endpoint ID", apiv1.PathEndpoints, apiv1.ContainerIDPrefix)
			}
			var in apiv1.EndpointCreate
			if err := api.DecodeJSON(r, &in); err != nil {
				return nil, err
			}
			if in.ContainerID != "" && in.ContainerID != s.ContainerID {
				return nil, api.BadRequest("containerID %q in the body is not the %q of the path", in.ContainerID, s.ContainerID)
			}
			ep, err := m.Create(r.Context(), CreateRequest{
				ContainerID: s.ContainerID, Netns: in.Netns, IfName: in.Interface,
				PodNamespace: in.PodNamespace, PodName: in.PodName, PodUID: in.PodUID,
			})
			if err != nil {
				return nil, apiError(err)
			}
			return m.toAPI(ep), nil
		}},
		api.Route{Method: http.MethodDelete, Path: path, Handler: func(r *http.Request) (any, error) {
			s, err := selector(r, apiv1.QueryInterface)
			if err != nil {
				return nil, err
			}
			d, err := m.Delete(r.Context(), s)
			if err != nil {
				return nil, apiError(err)
			}
			out := apiv1.EndpointDeleted{ReleasedIPs: addrStrings(d.Released)}
			if d.Endpoint != nil {
				ep := m.toAPI(d.Endpoint)
				out.Endpoint = &ep
			}
			return out, nil
		}},
	)
}

// selector parses the {id} of a path and refuses query parameters other
// than allowed: apiv1.QueryInterface, with a container ID, is the
// Selector's IfName.
func selector(r *http.Request, allowed ...string) (Selector, error) {
	q, err := api.QueryParams(r, allowed...)
	if err != nil {
		return Selector{}, err
	}
	id := r.PathValue("id")
	if cid, ok := strings.CutPrefix(id, apiv1.ContainerIDPrefix); ok {
		if err := validContainerID(cid); err != nil {
			return Selector{}, api.BadRequest("%s", err)
		}
		s := Selector{ContainerID: cid}
		if q.Has(apiv1.QueryInterface) {
			s.IfName = q.Get(apiv1.QueryInterface)
			if err := validIfName(s.IfName); err != nil {
				return Selector{}, api.BadRequest("%s=: %s", apiv1.QueryInterface, err)
			}
		}
		return s, nil
	}
	if q.Has(apiv1.QueryInterface) {
		return Selector{}, api.BadRequest("%s= goes with %s<container ID>, not an endpoint ID", apiv1.QueryInterface, apiv1.ContainerIDPrefix)
	}
	n, err := strconv.ParseUint(id, 10, 16)
	if err != nil || n == 0 {
		return Selector{}, api.BadRequest("invalid endpoint %q: want an endpoint ID (1 to 65535) or %s<container ID>", id, apiv1.ContainerIDPrefix)
	}
	return Selector{ID: uint16(n)}, nil
}

// apiError gives a Manager or IPAM error its HTTP status.
func apiError(err error) error {
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, ipam.ErrInvalid):
		return api.BadRequest("%s", err)
	case errors.Is(err, ErrNotFound):
		return api.NotFound("%s", err)
	case errors.Is(err, ErrExists), errors.Is(err, ipam.ErrInUse):
		return api.Errorf(http.StatusConflict, "%s", err)
	case errors.Is(err, ErrNotReady), errors.Is(err, ipam.ErrNotReady),
		errors.Is(err, ErrExhausted), errors.Is(err, ipam.ErrExhausted), errors.Is(err, ErrBusy):
		return api.Errorf(http.StatusServiceUnavailable, "%s", err)
	}
	return err
}

func (m *Manager) toAPI(ep *Endpoint) apiv1.Endpoint {
	out := apiv1.Endpoint{
		ID: ep.ID, ContainerID: ep.ContainerID, Netns: ep.Netns, Interface: ep.IfName, MAC: ep.MAC.String(),
		HostInterface: ep.HostIfName, HostIfIndex: ep.HostIfIndex, HostMAC: ep.HostMAC.String(),
		PodNamespace: ep.PodNamespace, PodName: ep.PodName, Labels: ep.Labels,
		ServiceAccount: ep.ServiceAccount, NamespaceLabels: ep.NamespaceLabels, Health: ep.Health,
		Identity: uint32(ep.Identity), IdentityPending: ep.IdentityPending,
		State: string(ep.State), Error: ep.Error, Created: ep.Created,
	}
	out.Datapath, out.DatapathError = datapath(ep)
	if m.policy != nil {
		if pol, ok := m.policy.EndpointPolicy(m.db.ReadTxn(), ep.ID); ok {
			out.Policy = &apiv1.EndpointPolicy{Revision: pol.Revision, Ingress: pol.Ingress, Egress: pol.Egress,
				Entries: pol.Entries, Realized: pol.Realized, Error: pol.Error}
		}
	}
	if ep.IPv4.IsValid() {
		out.IPv4 = ep.IPv4.String()
	}
	if ep.IPv6.IsValid() {
		out.IPv6 = ep.IPv6.String()
	}
	for _, p := range m.ipam.Pools() {
		if p.Family == ipam.IPv4 && ep.IPv4.IsValid() {
			out.IPv4Gateway = p.Router.String()
		}
		if p.Family == ipam.IPv6 && ep.IPv6.IsValid() {
			out.IPv6Gateway = p.Router.String()
		}
	}
	return out
}

// datapath is where the endpoint stands in the datapath as a whole, in the
// endpoint map and with its programs: Error if either failed, else Pending
// (or Refreshing) until both are Done.
func datapath(ep *Endpoint) (kind, errText string) {
	statuses := []reconciler.Status{ep.MapStatus, ep.ProgramStatus}
	var errs []string
	for _, s := range statuses {
		if s.Kind == reconciler.StatusKindError {
			errs = append(errs, s.GetError())
		}
	}
	if len(errs) > 0 {
		return reconciler.StatusKindError.String(), strings.Join(errs, "; ")
	}
	for _, s := range statuses {
		if s.Kind != reconciler.StatusKindDone {
			return s.Kind.String(), ""
		}
	}
	return reconciler.StatusKindDone.String(), ""
}

func addrStrings(addrs []netip.Addr) []string {
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}
