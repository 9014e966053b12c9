package endpointmanager_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/bpfmaps"
	"github.com/cellium/cellium/cells/bpfmaps/bpfmapstest"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/policy"
	"github.com/cellium/cellium/cells/policymaps"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/policymap"
)

// TestCreateWaitsForPolicy: with the policy and policy-maps cells (real BPF
// maps), a pod that a default-deny policy selects, created while the
// agent's policy is not computed yet (its NetworkPolicies not listed),
// waits, counted in cellium_endpoints_waiting{for=policy}; its ADD returns
// only once its enforcement and its one allow (from the node) are in the
// maps.
func TestCreateWaitsForPolicy(t *testing.T) {
	var listable atomic.Bool
	var maps *policymaps.Maps
	web := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pod", Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: "node-1"},
	}
	deny := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "deny"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}
	root := bpfmapstest.Root(t)
	tn := newTestNet(t)
	n := tn.start(t, nodeOpts{
		k8s: []runtime.Object{web, deny},
		extra: []cell.Cell{bpfmaps.Cell, policy.Cell, policymaps.Cell,
			cell.Invoke(func(cs *k8sclient.Fake, m *policymaps.Maps) {
				maps = m
				// The NetworkPolicies cannot be listed until the test says.
				cs.PrependReactor("list", "networkpolicies", func(k8sclient.Action) (bool, runtime.Object, error) {
					if listable.Load() {
						return false, nil, nil
					}
					return true, nil, errors.New("the test holds the NetworkPolicies back")
				})
			})},
		configure: func(h *hive.Hive) { hive.AddConfigOverride(h, func(c *bpfmaps.Config) { c.BPFRoot = root }) },
	})
	n.waitRestored(t)

	p := newPod(t)
	done := n.createAsync(p)
	celltest.Eventually(t, "the creation waiting for its policy", func() (bool, string) {
		select {
		case r := <-done:
			t.Fatalf("Create returned before the policy was computed: %+v, %v", r.ep, r.err)
		default:
		}
		n := waiting(t, n.metrics, "policy")
		return n == 1, fmt.Sprint(n, " waiting")
	})
	ep, found := n.mgr.Lookup(endpointmanager.Selector{ContainerID: p.id})
	if !found || ep.State != endpointmanager.Starting {
		t.Fatalf("while the creation waits for its policy, the endpoint is %+v (found %v), want it starting", ep, found)
	}
	if _, err := maps.Enforcement.Lookup(uint32(ep.ID)); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("endpoint %d's enforcement is in the map before its policy was computed: %v", ep.ID, err)
	}

	listable.Store(true)
	var r createResult
	select {
	case r = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Create did not return within 60s of the NetworkPolicies becoming listable")
	}
	if r.err != nil {
		t.Fatalf("Create: %v", r.err)
	}
	// At once, with no wait: the ADD has returned.
	enf, err := maps.Enforcement.Lookup(uint32(r.ep.ID))
	if err != nil || enf.Flags != policymap.FlagIngress {
		t.Fatalf("endpoint %d's enforcement when its creation returned: %+v, %v; want ingress", r.ep.ID, enf, err)
	}
	keys, err := policymap.KeysOf(policymap.Allow{EndpointID: r.ep.ID, Direction: policymap.Ingress, Identity: uint32(identity.Host)})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := maps.Policy.Lookup(k); err != nil {
			t.Fatalf("endpoint %d's allow from the node (%s) when its creation returned: %v", r.ep.ID, k, err)
		}
	}
	if got := waiting(t, n.metrics, "policy"); got != 0 {
		t.Errorf("cellium_endpoints_waiting{for=policy} = %v after the creation, want 0", got)
	}
	api, err := n.client.Endpoint(context.Background(), "container-id:"+p.id)
	if err != nil {
		t.Fatal(err)
	}
	if pol := api.Policy; pol == nil || !pol.Ingress || pol.Egress || !pol.Realized || pol.Entries != 1 || pol.Revision == 0 {
		t.Fatalf("GET the endpoint: policy %+v, want ingress enforced, one entry, realized, a revision", pol)
	}
}
