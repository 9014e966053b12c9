package policy

import (
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/cilium/statedb"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/pkg/apiv1"
)

func apiRoutes(p *Policy) api.Routes {
	return api.NewRoutes(
		api.Route{Method: http.MethodGet, Path: apiv1.PathPolicy, Handler: func(*http.Request) (any, error) {
			txn := p.db.ReadTxn()
			out := apiv1.PolicyList{Revision: p.rules.Revision(txn), Policies: []apiv1.Policy{}}
			p.mu.Lock()
			defer p.mu.Unlock()
			for r, rev := range p.rules.All(txn) {
				out.Policies = append(out.Policies, p.apiPolicy(r, rev))
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathPolicySelectors, Handler: func(*http.Request) (any, error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			out := []apiv1.PolicySelector{}
			for _, key := range slices.Sorted(maps.Keys(p.engine.cache.sels)) {
				cs := p.engine.cache.sels[key]
				s := apiv1.PolicySelector{Selector: key, Identities: []uint32{}, Users: slices.Sorted(maps.Keys(cs.users))}
				for _, id := range p.engine.cache.identities(key) {
					s.Identities = append(s.Identities, uint32(id))
				}
				out = append(out, s)
			}
			return out, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathPolicyTrace, Handler: func(r *http.Request) (any, error) {
			q := r.URL.Query()
			if q.Get("from") == "" || q.Get("to") == "" || q.Get("port") == "" {
				return nil, api.BadRequest("trace: want from, to and port")
			}
			t, err := p.trace(q.Get("from"), q.Get("to"), q.Get("port"))
			if err != nil {
				return nil, api.BadRequest("trace: %v", err)
			}
			return t, nil
		}},
		api.Route{Method: http.MethodGet, Path: apiv1.PathPolicy + "/{namespace}/{name}", Handler: func(r *http.Request) (any, error) {
			name := r.PathValue("namespace") + "/" + r.PathValue("name")
			rule, rev, found := p.rules.Get(p.db.ReadTxn(), RuleByName.Query(name))
			if !found {
				return nil, api.NotFound("no NetworkPolicy %s", name)
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.apiPolicy(rule, rev), nil
		}},
	)
}

// apiPolicy is a rule as the API shows it; p.mu is held.
func (p *Policy) apiPolicy(r *Rule, rev statedb.Revision) apiv1.Policy {
	inForce, ok := p.engine.rules[r.Name]
	out := apiv1.Policy{Name: r.Name, PodSelector: r.PodSelector, PolicyTypes: []string{}, Revision: rev,
		Applied: ok && inForce == r, InForce: ok, Error: r.Error}
	if ok {
		out.Endpoints = slices.Sorted(maps.Keys(p.engine.ruleEndpoints[r.Name]))
	}
	if r.Ingress {
		out.PolicyTypes = append(out.PolicyTypes, "Ingress")
	}
	if r.Egress {
		out.PolicyTypes = append(out.PolicyTypes, "Egress")
	}
	for _, pr := range r.IngressRules {
		out.Ingress = append(out.Ingress, apiRule(pr))
	}
	for _, pr := range r.EgressRules {
		out.Egress = append(out.Egress, apiRule(pr))
	}
	return out
}

func apiRule(pr PeerRule) apiv1.PolicyRule {
	out := apiv1.PolicyRule{Peers: slices.Clone(pr.Selectors), Ports: []string{}}
	if pr.Everyone {
		out.Peers = append(out.Peers, "everyone")
	}
	for _, b := range pr.IPBlocks {
		s := "ipBlock " + b.CIDR.String()
		if len(b.Except) > 0 {
			ex := make([]string, len(b.Except))
			for i, e := range b.Except {
				ex[i] = e.String()
			}
			s += " except " + strings.Join(ex, ",")
		}
		out.Peers = append(out.Peers, s)
	}
	for _, port := range pr.Ports {
		out.Ports = append(out.Ports, port.String())
	}
	if len(pr.Ports) == 0 {
		out.Ports = append(out.Ports, "any")
	}
	return out
}
