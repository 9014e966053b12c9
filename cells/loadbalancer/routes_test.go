package loadbalancer_test

import (
	"errors"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/statedb"
	"github.com/cilium/statedb/reconciler"

	"github.com/cellium/cellium/cells/api"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/client"
)

const apiObjects = `
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  clusterIP: 10.96.0.20
  sessionAffinity: ClientIP
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports:
  - {name: http, port: 80, nodePort: 30080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080}
endpoints:
- addresses: [10.244.1.5]
  nodeName: node-1
- addresses: [10.244.2.5]
  nodeName: node-2
  conditions: {ready: false, serving: true, terminating: true}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  ports:
  - {name: dns, port: 53, protocol: UDP}
`

// TestServicesAPI asks a running loadbalancer cell over the API socket with
// pkg/client, as `agent service` does.
func TestServicesAPI(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "agent.sock")
	a := newTestAgent(t, api.Cell)
	hive.AddConfigOverride(a.hive, func(c *api.Config) { c.APISocket = socket })
	celltest.Start(t, a.hive)
	objs, err := k8sclienttest.Decode([]byte(apiObjects))
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if err := k8sclienttest.Create(a.k8s.cs, obj); err != nil {
			t.Fatal(err)
		}
	}
	// Three frontends: the ClusterIPs and the NodePort wildcard.
	a.waitFrontends(t, func(fes []*loadbalancer.Frontend) bool {
		done := 0
		for _, fe := range fes {
			if fe.Status.Kind() == reconciler.StatusKindDone && (fe.ServiceName.Name != "web" || len(fe.Backends) > 0) {
				done++
			}
		}
		return done == 3
	})

	c := client.New(socket)
	ctx := t.Context()
	web := apiv1.Service{
		Namespace: "shop", Name: "web", Type: "NodePort",
		ClusterIPs:             []string{"10.96.0.20"},
		Ports:                  []apiv1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: "TCP"}},
		AffinityTimeoutSeconds: 10800,
		ExternalTrafficPolicy:  "Local",
		InternalTrafficPolicy:  "Cluster",
		HealthCheckNodePort:    32000,
		Frontends: []apiv1.Frontend{
			// The terminating backend is unused while one is active.
			{Address: "0.0.0.0:30080/TCP", Type: "NodePort", PortName: "http", Status: "Done",
				Backends: []apiv1.FrontendBackend{{Address: "10.244.1.5:8080/TCP", State: "active"}}},
			{Address: "10.96.0.20:80/TCP", Type: "ClusterIP", PortName: "http", Status: "Done",
				Backends: []apiv1.FrontendBackend{{Address: "10.244.1.5:8080/TCP", State: "active"}}},
		},
		Backends: []apiv1.Backend{
			{Address: "10.244.1.5:8080/TCP", PortName: "http", State: "active", NodeName: "node-1", EndpointSlice: "web-1"},
			{Address: "10.244.2.5:8080/TCP", PortName: "http", State: "terminating", NodeName: "node-2", EndpointSlice: "web-1"},
		},
	}
	dns := apiv1.Service{
		Namespace: "kube-system", Name: "kube-dns", Type: "ClusterIP",
		ClusterIPs:            []string{"10.96.0.10"},
		Ports:                 []apiv1.ServicePort{{Name: "dns", Port: 53, Protocol: "UDP"}},
		ExternalTrafficPolicy: "Cluster",
		InternalTrafficPolicy: "Cluster",
		Frontends: []apiv1.Frontend{
			{Address: "10.96.0.10:53/UDP", Type: "ClusterIP", PortName: "dns", Status: "Done", Backends: []apiv1.FrontendBackend{}},
		},
		Backends: []apiv1.Backend{},
	}

	all, err := c.Services(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []apiv1.Service{dns, web}; !reflect.DeepEqual(all, want) {
		t.Errorf("Services(\"\") =\n%+v\nwant\n%+v", all, want)
	}
	shop, err := c.Services(ctx, "shop")
	if err != nil {
		t.Fatal(err)
	}
	if want := []apiv1.Service{web}; !reflect.DeepEqual(shop, want) {
		t.Errorf("Services(shop) =\n%+v\nwant\n%+v", shop, want)
	}
	// "kube" is a prefix of kube-system, not a namespace.
	if none, err := c.Services(ctx, "kube"); err != nil || len(none) != 0 {
		t.Errorf("Services(kube) = %+v, %v; want none", none, err)
	}
	got, err := c.Service(ctx, "shop", "web")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, web) {
		t.Errorf("Service(shop, web) =\n%+v\nwant\n%+v", got, web)
	}

	_, err = c.Service(ctx, "shop", "gone")
	wantAPIError(t, err, http.StatusNotFound, "no service shop/gone: `agent service list` shows the services the agent knows")
	_, err = c.Services(ctx, "a/b")
	wantAPIError(t, err, http.StatusBadRequest, `invalid namespace "a/b": want a namespace name such as kube-system`)
	err = c.Do(ctx, http.MethodGet, apiv1.PathServices, map[string][]string{"name": {"web"}}, nil, nil)
	wantAPIError(t, err, http.StatusBadRequest, `unknown query parameter "name": /v1/services takes namespace`)
}

func wantAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	apiErr, ok := errors.AsType[*client.APIError](err)
	if !ok || apiErr.Status != status || apiErr.Message != msg {
		t.Errorf("error = %v, want %d %q", err, status, msg)
	}
}

// waitFrontends waits until the frontends table satisfies ok.
func (a *testAgent) waitFrontends(t *testing.T, ok func([]*loadbalancer.Frontend) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		rows, watch := a.frontends.AllWatch(a.db.ReadTxn())
		fes := statedb.Collect(rows)
		if ok(fes) {
			return
		}
		select {
		case <-watch:
		case <-timeout:
			t.Fatalf("frontends never got there; last:\n%v", fes)
		}
	}
}
