package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/apiv1"
)

// startServiceAgent runs the loadbalancer and api cells in this process,
// over a fake clientset holding a service with two endpoints, and returns
// the API socket once the service's frontend has its backends.
func startServiceAgent(t *testing.T) string {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	ready, port, proto := true, int32(8080), corev1.ProtocolTCP
	portName, node := "http", "node-1"
	objects := []runtime.Object{
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
			Spec: corev1.ServiceSpec{
				ClusterIP: "10.96.0.20",
				Ports:     []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
			},
		},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
			Endpoints: []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.1.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &node},
				{Addresses: []string{"10.244.2.5"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			},
		},
	}
	var (
		db        *statedb.DB
		frontends statedb.Table[*loadbalancer.Frontend]
	)
	opts := hive.DefaultOptions()
	opts.ModuleDecorators = health.ModuleDecorators
	h := hive.NewWithOptions(opts,
		statedb.Cell, job.Cell, health.Cell, api.Cell, loadbalancer.Cell, k8sclienttest.Cell(objects...),
		cell.Provide(
			func() daemon.NodeName { return "node-1" },
			func(db *statedb.DB) (statedb.Table[*devices.NodeAddress], error) {
				return statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
			},
		),
		cell.Invoke(func(d *statedb.DB, f statedb.Table[*loadbalancer.Frontend]) { db, frontends = d, f }),
		health.StartedMarker,
	)
	hive.AddConfigOverride(h, func(c *health.Config) { c.HealthAddr = "" })
	hive.AddConfigOverride(h, func(c *api.Config) { c.APISocket = socket })
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Stop(log, context.Background()) })

	timeout := time.After(10 * time.Second)
	for {
		fe, _, watch, found := frontends.GetWatch(db.ReadTxn(), loadbalancer.FrontendByAddress.Query(
			loadbalancer.L3n4Addr{Addr: netip.MustParseAddr("10.96.0.20"), Port: 80, Protocol: loadbalancer.TCP}))
		if found && len(fe.Backends) == 2 {
			return socket
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatal("the frontend 10.96.0.20:80/TCP never got its two backends")
		}
	}
}

func TestServiceCommands(t *testing.T) {
	socket := startServiceAgent(t)
	run := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		code := execute(append(args, "--api-socket", socket), &out, &errOut)
		return out.String(), errOut.String(), code
	}

	// No reconciler runs here: the frontend stays Pending.
	out, errOut, code := run("service", "list")
	wantList := "FRONTEND            TYPE        SERVICE    BACKENDS                                                     STATUS\n" +
		"10.96.0.20:80/TCP   ClusterIP   shop/web   10.244.1.5:8080/TCP (active), 10.244.2.5:8080/TCP (active)   Pending\n"
	if code != 0 || out != wantList {
		t.Errorf("service list = %d %q\n%s\nwant\n%s", code, errOut, out, wantList)
	}

	out, _, code = run("service", "list", "-n", "other")
	if code != 0 || strings.Count(out, "\n") != 1 {
		t.Errorf("service list -n other = %d\n%s\nwant only the header", code, out)
	}

	out, errOut, code = run("service", "list", "-o", "json")
	var services []apiv1.Service
	if code != 0 || json.Unmarshal([]byte(out), &services) != nil || len(services) != 1 || services[0].Name != "web" {
		t.Errorf("service list -o json = %d %q\n%s", code, errOut, out)
	}

	out, errOut, code = run("service", "get", "shop/web")
	wantGet := `Service:           shop/web
Type:              ClusterIP
ClusterIPs:        10.96.0.20
ExternalIPs:       -
LoadBalancerIPs:   -
Ports:             http 80/TCP
Session affinity:  None
Traffic policy:    external Cluster, internal Cluster

FRONTEND            TYPE        PORT   BACKENDS                                                     STATUS
10.96.0.20:80/TCP   ClusterIP   http   10.244.1.5:8080/TCP (active), 10.244.2.5:8080/TCP (active)   Pending

BACKEND               PORT   STATE    NODE     ENDPOINTSLICE
10.244.1.5:8080/TCP   http   active   node-1   web-1
10.244.2.5:8080/TCP   http   active            web-1
`
	if code != 0 || out != wantGet {
		t.Errorf("service get shop/web = %d %q\n%s\nwant\n%s", code, errOut, out, wantGet)
	}

	_, errOut, code = run("service", "get", "shop/gone")
	if code != 1 || !strings.Contains(errOut, "agent answered 404 Not Found: no service shop/gone") {
		t.Errorf("service get shop/gone = %d %q, want 404 naming it", code, errOut)
	}
	for _, bad := range []string{"web", "shop/", "/web", "a/b/c"} {
		_, errOut, code = run("service", "get", bad)
		want := `invalid service "` + bad + `": want NAMESPACE/NAME, e.g. kube-system/kube-dns`
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("service get %s = %d %q, want %q", bad, code, errOut, want)
		}
	}
}
