package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/policy"
)

type liveParams struct {
	cell.In
	Live    []endpointmanager.LiveCondition `group:"endpoint-live"`
	View    endpointmanager.PolicyView
	Entries statedb.RWTable[*policy.Entry]
	Enf     statedb.RWTable[*policy.Enforcement]
}

// TestLiveCondition: the policy's live condition holds a new endpoint back
// until its policy is computed from the endpoints table as of its row or
// later, and its enforcement and every entry are reconciled; `agent
// endpoint get` shows the policy.
func TestLiveCondition(t *testing.T) {
	var lp liveParams
	deny := netpol("deny", networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}})
	a, h := newAgent(t, cell.Invoke(func(p liveParams) { lp = p }), deny)
	celltest.Start(t, h)
	if len(lp.Live) != 1 || lp.Live[0].Name != "policy" {
		t.Fatalf("live conditions %+v, want the policy's", lp.Live)
	}
	live := lp.Live[0].Live
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, nil)

	ep := &endpointmanager.Endpoint{ID: 7, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 1001}
	wtxn := a.db.WriteTxn(a.endpoints)
	if _, _, err := a.endpoints.Insert(wtxn, ep); err != nil {
		t.Fatal(err)
	}
	_, rev, _ := a.endpoints.Get(wtxn, endpointmanager.EndpointID.Query(7))
	wtxn.Commit()

	// Computed, but nothing reconciles the entries here: not live.
	var why string
	celltest.Eventually(t, "endpoint 7's policy computed", func() (bool, string) {
		var ok bool
		ok, why, _ = live(ep, rev)
		if ok {
			t.Fatalf("live with nothing reconciled")
		}
		return why != "not computed yet", why
	})
	if !strings.Contains(why, "Pending") {
		t.Fatalf("not live because %q, want a pending row named", why)
	}
	if in, out := a.enforcementOf(7); !in || out {
		t.Fatalf("endpoint 7 isolated ingress %v egress %v, want ingress (default deny)", in, out)
	}
	if pol, ok := lp.View.EndpointPolicy(a.db.ReadTxn(), 7); !ok || pol.Realized || !pol.Ingress || pol.Egress || pol.Entries != 1 || pol.Revision == 0 {
		t.Fatalf("EndpointPolicy(7) = %+v, %v; want ingress enforced, one entry (the host), not realized", pol, ok)
	}

	// The reconciler's part: every row done.
	wtxn = a.db.WriteTxn(lp.Entries, lp.Enf)
	for e := range lp.Entries.List(wtxn, policy.EntryByEndpoint.Query(7)) {
		e = e.Clone()
		e.Status = reconciler.StatusDone()
		lp.Entries.Insert(wtxn, e)
	}
	enf, _, _ := lp.Enf.Get(wtxn, policy.EnforcementByEndpoint.Query(7))
	enf = enf.Clone()
	enf.Status = reconciler.StatusDone()
	lp.Enf.Insert(wtxn, enf)
	wtxn.Commit()
	if ok, why, _ := live(ep, rev); !ok {
		t.Fatalf("not live once every row is reconciled: %s", why)
	}
	if pol, ok := lp.View.EndpointPolicy(a.db.ReadTxn(), 7); !ok || !pol.Realized {
		t.Fatalf("EndpointPolicy(7) = %+v, %v; want realized", pol, ok)
	}

	// Rows of the endpoint's ID that a computation not yet reading the
	// endpoint's row left (an ID used again) do not count.
	if ok, why, watch := live(ep, rev+1_000_000); ok || why != "not computed yet" || watch == nil {
		t.Fatalf("live for a row the computation has not read: %v, %q", ok, why)
	}
}

// TestLiveConditionWaitsForPeers: a new endpoint whose identity another
// local endpoint's policy allows is held back until that endpoint's allow
// is in the maps too (else the peer would drop the new pod's first
// packets); a peer's allow that failed does not hold it back.
func TestLiveConditionWaitsForPeers(t *testing.T) {
	var lp liveParams
	client := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}
	a, h := newAgent(t, cell.Invoke(func(p liveParams) { lp = p }), netpol("from-client", ingressFrom(client)))
	celltest.Start(t, h)
	live := lp.Live[0].Live
	// done marks the pending entries that only accepts, and every
	// enforcement row, done: the reconciler's part.
	done := func(only func(*policy.Entry) bool) {
		wtxn := a.db.WriteTxn(lp.Entries, lp.Enf)
		defer wtxn.Commit()
		for e := range lp.Entries.All(wtxn) {
			if e.Status.Kind == reconciler.StatusKindPending && only(e) {
				e = e.Clone()
				e.Status = reconciler.StatusDone()
				lp.Entries.Insert(wtxn, e)
			}
		}
		for e := range lp.Enf.All(wtxn) {
			e = e.Clone()
			e.Status = reconciler.StatusDone()
			lp.Enf.Insert(wtxn, e)
		}
	}
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, nil)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 1001})
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host")
	done(func(*policy.Entry) bool { return true })

	// The client: a new identity, which endpoint 1 allows.
	a.addIdentity(1003, "prod", map[string]string{"app": "client"}, nil)
	ep := &endpointmanager.Endpoint{ID: 2, PodNamespace: "prod", PodName: "client", Labels: map[string]string{"app": "client"}, Identity: 1003}
	wtxn := a.db.WriteTxn(a.endpoints)
	a.endpoints.Insert(wtxn, ep)
	_, rev, _ := a.endpoints.Get(wtxn, endpointmanager.EndpointID.Query(2))
	wtxn.Commit()
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 0 0-0 prod/from-client")
	// Its own policy (not isolated) done, the peer's allow pending.
	celltest.Eventually(t, "endpoint 2's policy computed", func() (bool, string) {
		_, why, _ := live(ep, rev)
		return why != "not computed yet", why
	})
	done(func(e *policy.Entry) bool { return e.Key.EndpointID == 2 })
	ok, why, watch := live(ep, rev)
	if ok || !strings.Contains(why, "endpoint 1's allow of identity 1003") || watch == nil {
		t.Fatalf("live %v (%q, watch %v) while endpoint 1's allow of the new identity is pending, want not live, saying so, with a watch", ok, why, watch != nil)
	}
	// A failed allow of the peer does not hold it.
	wtxn = a.db.WriteTxn(lp.Entries)
	for e := range lp.Entries.List(wtxn, policy.EntryByEndpoint.Query(1)) {
		if e.Key.Identity == 1003 {
			e = e.Clone()
			e.Status = reconciler.StatusError(errors.New("map full"))
			lp.Entries.Insert(wtxn, e)
		}
	}
	wtxn.Commit()
	if ok, why, _ := live(ep, rev); !ok {
		t.Fatalf("not live with the peer's allow failed: %s", why)
	}
}
