package policy_test

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/hive"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
)

// TestAPI asks a running policy cell over the API socket with pkg/client,
// as `agent policy` does.
func TestAPI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	a, h := newAgent(t, api.Cell)
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	celltest.Start(t, h)
	prod := map[string]string{"team": "a"}
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, prod)
	a.addIdentity(1003, "prod", map[string]string{"app": "client"}, prod)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"}, Identity: 1001})
	clientPeer := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}
	udp := corev1.ProtocolUDP
	spec := ingressFrom(clientPeer, portOf(intstr.FromInt32(8080)), networkingv1.NetworkPolicyPort{Protocol: &udp})
	for _, np := range []*networkingv1.NetworkPolicy{netpol("from-client", spec), netpol("bad", ingressFrom(networkingv1.NetworkPolicyPeer{}))} {
		if err := k8sclienttest.Create(a.cs, np); err != nil {
			t.Fatal(err)
		}
	}
	a.waitEntries(1, "ingress 1 0 0-0 reserved:host", "ingress 1003 6 8080-0 prod/from-client", "ingress 1003 17 0-0 prod/from-client")

	c := client.New(socket)
	ctx := t.Context()
	// The entries above are from-client's: the bad policy may come in a
	// later batch.
	var list apiv1.PolicyList
	celltest.Eventually(t, "Policies() with a revision and two policies", func() (bool, string) {
		var err error
		list, err = c.Policies(ctx)
		return err == nil && list.Revision != 0 && len(list.Policies) == 2, fmt.Sprintf("%+v, %v", list, err)
	})
	bad, good := list.Policies[0], list.Policies[1]
	if bad.Name != "prod/bad" || bad.Applied || bad.InForce || !strings.Contains(bad.Error, "NetworkPolicy prod/bad: ingress[0]: peer 0") {
		t.Errorf("prod/bad = %+v, want it not applied, with its error", bad)
	}
	want := apiv1.Policy{Name: "prod/from-client", PodSelector: "app=web", PolicyTypes: []string{"Ingress"},
		Ingress:  []apiv1.PolicyRule{{Peers: []string{"ns=prod pods{app=client}"}, Ports: []string{"8080/TCP", "*/UDP"}}},
		Revision: good.Revision, Applied: true, InForce: true, Endpoints: []uint16{1}}
	if !reflect.DeepEqual(good, want) {
		t.Errorf("prod/from-client =\n%+v\nwant\n%+v", good, want)
	}
	one, err := c.Policy(ctx, "prod/from-client")
	if err != nil || !reflect.DeepEqual(one, want) {
		t.Errorf("Policy(prod/from-client) = %+v, %v", one, err)
	}
	if _, err := c.Policy(ctx, "prod/nothing"); err == nil || !strings.Contains(err.Error(), "no NetworkPolicy prod/nothing") {
		t.Errorf("Policy(prod/nothing): %v, want not found", err)
	}

	sels, err := c.PolicySelectors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSels := []apiv1.PolicySelector{{Selector: "ns=prod pods{app=client}", Identities: []uint32{1003}, Users: []string{"prod/from-client"}}}
	if !reflect.DeepEqual(sels, wantSels) {
		t.Errorf("PolicySelectors() = %+v, want %+v", sels, wantSels)
	}

	for _, tc := range []struct {
		from, port string
		allowed    bool
		allowedBy  []string
	}{
		{"1003", "8080/TCP", true, []string{"prod/from-client"}},
		{"1003", "53/UDP", true, []string{"prod/from-client"}},
		{"1003", "9090/TCP", false, []string{}},
		{"world", "8080", false, []string{}},
		{"host", "ICMP", true, []string{"reserved:host"}},
	} {
		tr, err := c.PolicyTrace(ctx, tc.from, "prod/web", tc.port)
		if err != nil {
			t.Fatal(err)
		}
		wantSide := apiv1.PolicyTraceSide{Endpoint: 1, Pod: "prod/web", Direction: "ingress", Peer: tr.Sides[0].Peer,
			SelectedBy: []string{"prod/from-client"}, Isolated: true, AllowedBy: tc.allowedBy, Allowed: tc.allowed}
		if tr.Allowed != tc.allowed || len(tr.Sides) != 1 || !reflect.DeepEqual(tr.Sides[0], wantSide) {
			t.Errorf("trace %s -> prod/web %s = %+v, want allowed %v by %v", tc.from, tc.port, tr, tc.allowed, tc.allowedBy)
		}
	}
	if _, err := c.PolicyTrace(ctx, "prod/ghost", "prod/web", "80/TCP"); err == nil || !strings.Contains(err.Error(), "no endpoint of pod prod/ghost") {
		t.Errorf("trace from an unknown pod: %v", err)
	}
	if _, err := c.PolicyTrace(ctx, "world", "prod/web", "80/GRE"); err == nil || !strings.Contains(err.Error(), `port "80/GRE"`) {
		t.Errorf("trace with a bad port: %v", err)
	}
}

// TestTraceAddress: a trace names a party by address: its ipBlock prefix
// decides, an except included, and a local pod's address is that pod.
func TestTraceAddress(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	a, h := newAgent(t, api.Cell)
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	celltest.Start(t, h)
	a.addIdentity(1001, "prod", map[string]string{"app": "web"}, nil)
	a.addEndpoint(&endpointmanager.Endpoint{ID: 1, PodNamespace: "prod", PodName: "web", Labels: map[string]string{"app": "web"},
		Identity: 1001, IPv4: netip.MustParseAddr("10.1.0.1")})
	block := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.10/32"}}}
	if err := k8sclienttest.Create(a.cs, netpol("outside", ingressFrom(block, portOf(intstr.FromInt32(80))))); err != nil {
		t.Fatal(err)
	}
	c := client.New(socket)
	for _, tc := range []struct {
		from, to, prefix string
		allowed          bool
	}{
		{"192.0.2.7", "prod/web", "192.0.2.0/24", true},
		{"192.0.2.7", "10.1.0.1", "192.0.2.0/24", true},
		{"192.0.2.10", "prod/web", "192.0.2.10/32", false},
		{"198.51.100.1", "prod/web", "", false},
		{"world", "prod/web", "", false}, // no address: no prefix
	} {
		var tr apiv1.PolicyTrace
		celltest.Eventually(t, "trace "+tc.from+" -> "+tc.to, func() (bool, string) {
			var err error
			tr, err = c.PolicyTrace(t.Context(), tc.from, tc.to, "80/TCP")
			return err == nil && len(tr.Sides) == 1 && tr.Sides[0].Isolated, fmt.Sprintf("%+v, %v", tr, err)
		})
		s := tr.Sides[0]
		if tr.Allowed != tc.allowed || s.PeerPrefix != tc.prefix || s.Peer != 2 || s.Pod != "prod/web" {
			t.Errorf("trace %s -> %s = %+v, want allowed %v with prefix %q", tc.from, tc.to, tr, tc.allowed, tc.prefix)
		}
		if tc.allowed && !reflect.DeepEqual(s.AllowedBy, []string{"prod/outside"}) {
			t.Errorf("trace %s -> %s allowed by %v, want prod/outside", tc.from, tc.to, s.AllowedBy)
		}
	}
}
