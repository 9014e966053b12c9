package policy

import (
	"fmt"
	"sync"

	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/endpointmanager"
)

// progress is how far the job compute-policy has read the endpoints table:
// the revision of the table in the last batch it wrote, and a channel
// closed when a later batch is written.
type progress struct {
	mu      sync.Mutex
	upTo    statedb.Revision
	changed chan struct{}
}

func newProgress() *progress { return &progress{changed: make(chan struct{})} }

func (c *progress) set(rev statedb.Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev <= c.upTo {
		return
	}
	c.upTo = rev
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *progress) get() (statedb.Revision, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.upTo, c.changed
}

// liveCondition holds back a new endpoint (its routes, its readiness and
// its CNI ADD) until its policy is in the maps: computed from the
// endpoints table as of the endpoint's creation or later, and its
// enforcement row and every entry reconciled, and the other local
// endpoints' allows of its identity too (peersLive). Until the policy is first
// computed (NetworkPolicies, endpoints and pods listed, and the identities
// too unless etcd is unreachable), no endpoint's is.
func liveCondition(p *Policy) endpointmanager.LiveOut {
	return endpointmanager.LiveOut{Condition: endpointmanager.LiveCondition{Name: "policy", Live: p.endpointLive}}
}

func (p *Policy) endpointLive(ep *endpointmanager.Endpoint, rev statedb.Revision) (bool, string, <-chan struct{}) {
	upTo, later := p.progress.get()
	if upTo < rev {
		return false, "not computed yet", later
	}
	// Read after the batch that computed it was committed.
	txn := p.db.ReadTxn()
	enf, _, watch, found := p.enforcement.GetWatch(txn, EnforcementByEndpoint.Query(ep.ID))
	if !found {
		return false, "no enforcement computed", watch
	}
	if enf.Status.Kind != reconciler.StatusKindDone {
		return false, "enforcement " + statusText(enf.Status), watch
	}
	entries, watch := p.entries.ListWatch(txn, EntryByEndpoint.Query(ep.ID))
	for e := range entries {
		if e.Status.Kind != reconciler.StatusKindDone {
			return false, fmt.Sprintf("entry %s %s", e.Key, statusText(e.Status)), watch
		}
	}
	return p.peersLive(txn, ep)
}

// peersLive: the other local endpoints' allows of ep's identity are in the
// maps. A pod with a new identity would otherwise be answered before a
// local peer whose policy allows it can accept it, and the peer would drop
// the pod's first packets. The batch that computed ep's policy (the
// identity's row is written before the endpoint's) wrote these entries
// too, so the wait is for their reconciliation alone. An entry that failed
// does not hold the pod back: its endpoint is the one in trouble, and
// health names it.
func (p *Policy) peersLive(txn statedb.ReadTxn, ep *endpointmanager.Endpoint) (bool, string, <-chan struct{}) {
	if ep.Identity == 0 {
		return true, "", nil
	}
	for peer := range p.endpoints.All(txn) {
		if peer.ID == ep.ID {
			continue
		}
		entries, watch := p.entries.ListWatch(txn, EntryByEndpointIdentity.Query(EndpointIdentity{peer.ID, ep.Identity}))
		for e := range entries {
			if e.Status.Kind == reconciler.StatusKindPending {
				return false, fmt.Sprintf("endpoint %d's allow of identity %d (entry %s) Pending", peer.ID, ep.Identity, e.Key), watch
			}
		}
	}
	return true, "", nil
}

func statusText(s reconciler.Status) string {
	if s.Kind == reconciler.StatusKindError {
		return "failed: " + s.GetError()
	}
	return s.Kind.String()
}

// EndpointPolicy is an endpoint's policy for `agent endpoint get`.
func (p *Policy) EndpointPolicy(txn statedb.ReadTxn, id uint16) (endpointmanager.EndpointPolicy, bool) {
	enf, _, found := p.enforcement.Get(txn, EnforcementByEndpoint.Query(id))
	if !found {
		return endpointmanager.EndpointPolicy{}, false
	}
	out := endpointmanager.EndpointPolicy{Revision: enf.Revision, Ingress: enf.Ingress, Egress: enf.Egress,
		Realized: enf.Status.Kind == reconciler.StatusKindDone}
	if enf.Status.Kind == reconciler.StatusKindError {
		out.Error = enf.Status.GetError()
	}
	for e := range p.entries.List(txn, EntryByEndpoint.Query(id)) {
		out.Entries++
		if e.Status.Kind != reconciler.StatusKindDone {
			out.Realized = false
		}
		if e.Status.Kind == reconciler.StatusKindError && out.Error == "" {
			out.Error = e.Status.GetError()
		}
	}
	return out, true
}

func policyView(p *Policy) endpointmanager.PolicyView { return p }
