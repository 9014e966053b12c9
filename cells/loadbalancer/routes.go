package loadbalancer

import (
	"cmp"
	"net/http"
	"slices"
	"strings"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

// apiRoutes serves GET /v1/services and GET /v1/services/{namespace}/{name}.
func apiRoutes(db *statedb.DB, t *lbTables) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathServices, Handler: func(req *http.Request) (any, error) {
			q, err := api.QueryParams(req, "namespace")
			if err != nil {
				return nil, err
			}
			ns := q.Get("namespace")
			if q.Has("namespace") && (ns == "" || strings.Contains(ns, "/")) {
				return nil, api.BadRequest("invalid namespace %q: want a namespace name such as kube-system", ns)
			}
			txn := db.ReadTxn()
			services := t.services.All(txn)
			if ns != "" {
				// Keys are "namespace/name": the namespace and its slash
				// are a prefix of exactly its services.
				services = t.services.Prefix(txn, ServiceByName.Query(ServiceName{Namespace: ns}))
			}
			out := []apiv1.Service{}
			for svc := range services {
				out = append(out, serviceAnswer(txn, t, svc))
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathServices + "/{namespace}/{name}", Handler: func(req *http.Request) (any, error) {
			if _, err := api.QueryParams(req); err != nil {
				return nil, err
			}
			name := ServiceName{Namespace: req.PathValue("namespace"), Name: req.PathValue("name")}
			txn := db.ReadTxn()
			svc, _, found := t.services.Get(txn, ServiceByName.Query(name))
			if !found {
				return nil, api.NotFound("no service %s: `agent service list` shows the services the agent knows", name)
			}
			return serviceAnswer(txn, t, svc), nil
		}},
	)
}

func serviceAnswer(txn statedb.ReadTxn, t *lbTables, svc *Service) apiv1.Service {
	out := apiv1.Service{
		Namespace:             svc.Name.Namespace,
		Name:                  svc.Name.Name,
		Type:                  svc.Type.String(),
		ClusterIPs:            addrStrings(svc.ClusterIPs),
		ExternalIPs:           addrStrings(svc.ExternalIPs),
		LoadBalancerIPs:       addrStrings(svc.LoadBalancerIPs),
		ExternalTrafficPolicy: policyName(svc.ExtTrafficPolicyLocal),
		InternalTrafficPolicy: policyName(svc.IntTrafficPolicyLocal),
		HealthCheckNodePort:   svc.HealthCheckNodePort,
		Frontends:             []apiv1.Frontend{},
		Backends:              []apiv1.Backend{},
	}
	if svc.SessionAffinity {
		out.AffinityTimeoutSeconds = int64(svc.AffinityTimeout.Seconds())
	}
	for _, p := range svc.Ports {
		out.Ports = append(out.Ports, apiv1.ServicePort{Name: p.Name, Port: p.Port, NodePort: p.NodePort, Protocol: p.Protocol.String()})
	}

	// Frontends use backends in their state for this service and port.
	states := map[backendPort]BackendState{}
	type listed struct {
		Backend
		slice string
	}
	var backends []listed
	for row := range BackendsOf(txn, t.backends, svc.Name) {
		for _, be := range row.Backends {
			state := be.EffectiveState()
			key := backendPort{be.Address, be.PortName}
			if old, ok := states[key]; !ok || old != BackendActive {
				states[key] = state
			}
			backends = append(backends, listed{be, row.EndpointSlice})
		}
	}
	// By address, port name and slice, not by slice.
	slices.SortFunc(backends, func(a, b listed) int {
		return cmp.Or(a.Address.Compare(b.Address), strings.Compare(a.PortName, b.PortName), strings.Compare(a.slice, b.slice))
	})
	for _, be := range backends {
		out.Backends = append(out.Backends, apiv1.Backend{
			Address:       be.Address.String(),
			PortName:      be.PortName,
			State:         be.EffectiveState().String(),
			NodeName:      be.NodeName,
			EndpointSlice: be.slice,
		})
	}
	for _, fe := range FrontendsOf(txn, t.frontends, svc) {
		f := apiv1.Frontend{
			Address:  fe.Address.String(),
			Type:     fe.Type.String(),
			PortName: fe.PortName,
			Backends: make([]apiv1.FrontendBackend, len(fe.Backends)),
			Status:   fe.Status.Kind().String(),
			Error:    fe.GetStatus().GetError(),
		}
		for i, be := range fe.Backends {
			f.Backends[i] = apiv1.FrontendBackend{Address: be.String()}
			if state, ok := states[backendPort{be, fe.PortName}]; ok {
				f.Backends[i].State = state.String()
			}
		}
		out.Frontends = append(out.Frontends, f)
	}
	return out
}

type backendPort struct {
	addr     L3n4Addr
	portName string
}

func policyName(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

func addrStrings[T interface{ String() string }](xs []T) []string {
	if len(xs) == 0 {
		return nil
	}
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}
