package lbhealthcheck_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/devices"
	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
	"github.com/cellium/cellium/cells/lbhealthcheck"
	"github.com/cellium/cellium/cells/loadbalancer"
	"github.com/cellium/cellium/pkg/netlimit"
	"github.com/cellium/cellium/pkg/netlimit/netlimittest"
	"github.com/cellium/cellium/pkg/polltest"
)

const nodeName = "node-1"

type testAgent struct {
	cs       *k8sclient.Fake
	db       *statedb.DB
	health   statedb.Table[*health.Status]
	backends statedb.Table[*loadbalancer.SliceBackends]
	services statedb.Table[*loadbalancer.Service]
}

// start runs the loadbalancer and lb-healthcheck cells against the fake
// clientset, the listeners bound to 127.0.0.1.
func start(t *testing.T) *testAgent {
	a, h := newAgent(func(c *lbhealthcheck.Config) { c.HealthCheckNodeportBindAddress = "127.0.0.1" })
	celltest.Start(t, h)
	return a
}

func newAgent(config func(*lbhealthcheck.Config)) (*testAgent, *hive.Hive) {
	a := &testAgent{}
	h := celltest.New(
		loadbalancer.Cell,
		lbhealthcheck.Cell,
		k8sclienttest.Cell(),
		cell.Provide(func() daemon.NodeName { return nodeName }),
		cell.Provide(func(db *statedb.DB) (statedb.Table[*devices.NodeAddress], error) {
			return statedb.NewTable(db, devices.NodeAddressesTableName, devices.NodeAddressAddr)
		}),
		cell.Invoke(func(cs *k8sclient.Fake, db *statedb.DB, hs statedb.Table[*health.Status],
			bes statedb.Table[*loadbalancer.SliceBackends], svcs statedb.Table[*loadbalancer.Service]) {
			a.cs, a.db, a.health, a.backends, a.services = cs, db, hs, bes, svcs
		}),
	)
	hive.AddConfigOverride(h, config)
	return a, h
}

// freePort is a TCP port of 127.0.0.1 that nothing listened on a moment ago.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func lbService(name string, hcPort int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeLoadBalancer,
			ClusterIP:             "10.96.0.20",
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			HealthCheckNodePort:   hcPort,
			Ports:                 []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080}},
		},
	}
}

type endpoint struct{ addr, node string }

func slice(service string, eps ...endpoint) *discoveryv1.EndpointSlice {
	http, https := "http", "https"
	p80, p443 := int32(8080), int32(8443)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: service + "-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		// Two ports: a pod is one endpoint whatever its ports.
		Ports: []discoveryv1.EndpointPort{{Name: &http, Port: &p80}, {Name: &https, Port: &p443}},
	}
	for _, ep := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ep.addr}, NodeName: &ep.node})
	}
	return s
}

type answer struct {
	code    int
	header  http.Header
	body    string
	decoded struct {
		Service struct {
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		} `json:"service"`
		LocalEndpoints int `json:"localEndpoints"`
	}
	err error
}

func get(port uint16, path string) answer {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}
	if err == nil {
		a.err = json.Unmarshal(b, &a.decoded)
	}
	return a
}

// waitAnswer polls port until it answers with code and n local endpoints.
func waitAnswer(t *testing.T, port uint16, code, n int) answer {
	t.Helper()
	var last answer
	polltest.Until(t, fmt.Sprintf("port %d answering %d with localEndpoints %d", port, code, n), 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		last = get(port, "/healthz")
		return last.err == nil && last.code == code && last.decoded.LocalEndpoints == n,
			fmt.Sprintf("answer %d %q (error %v)", last.code, last.body, last.err)
	})
	return last
}

func checkAnswer(t *testing.T, a answer, n int) {
	t.Helper()
	if got := a.header.Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type %q, want application/json", got)
	}
	if got := a.header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options %q, want nosniff", got)
	}
	if got := a.header.Get("X-Load-Balancing-Endpoint-Weight"); got != fmt.Sprint(n) {
		t.Errorf("X-Load-Balancing-Endpoint-Weight %q, want %d", got, n)
	}
	if a.decoded.Service.Namespace != "shop" || a.decoded.Service.Name != "web" {
		t.Errorf("body %q: want service shop/web", a.body)
	}
}

// TestHealthCheckNodePort: a LoadBalancer Service with
// externalTrafficPolicy Local is served on its healthCheckNodePort: 503
// while none of its endpoints is on this node (one on another node does not
// count), 200 with the count once one is (a pod with two ports counts once),
// on any path. A port taken by someone else is an error in health naming
// the Service and the port while the other Service keeps serving; the
// listener closes when the Service goes.
func TestHealthCheckNodePort(t *testing.T) {
	a := start(t)
	port := freePort(t)
	if err := k8sclienttest.Create(a.cs, lbService("web", int32(port))); err != nil {
		t.Fatal(err)
	}
	checkAnswer(t, waitAnswer(t, port, http.StatusServiceUnavailable, 0), 0)

	// An endpoint on another node: still none here.
	if err := k8sclienttest.Create(a.cs, slice("web", endpoint{"10.244.2.5", "node-2"})); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the slice of node-2's backend in the backends table", func() (bool, string) {
		n := a.backends.NumObjects(a.db.ReadTxn())
		return n == 1, fmt.Sprint(n, " backends")
	})
	// The listener's count follows the same table transaction; one more
	// round trip through the server lets it catch up.
	checkAnswer(t, waitAnswer(t, port, http.StatusServiceUnavailable, 0), 0)

	if err := k8sclienttest.Update(a.cs, slice("web", endpoint{"10.244.2.5", "node-2"}, endpoint{"10.244.1.5", nodeName}, endpoint{"10.244.1.6", nodeName})); err != nil {
		t.Fatal(err)
	}
	ok := waitAnswer(t, port, http.StatusOK, 2)
	checkAnswer(t, ok, 2)
	if got := get(port, "/any/path"); got.code != http.StatusOK || got.decoded.LocalEndpoints != 2 {
		t.Errorf("GET /any/path: %d %q, want 200 with 2 local endpoints", got.code, got.body)
	}

	// A port someone else holds.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port
	other := lbService("other", int32(takenPort))
	other.Spec.ClusterIP = "10.96.0.21"
	other.Spec.Ports[0].NodePort = 30081
	if err := k8sclienttest.Create(a.cs, other); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Service shop/other: health check node port %d: ", takenPort)
	celltest.Eventually(t, "health naming shop/other and its port", func() (bool, string) {
		var seen []string
		for st := range a.health.All(a.db.ReadTxn()) {
			if st.Path[0] == "lb-healthcheck" && st.Level == cell.StatusDegraded && strings.Contains(st.Error, want) {
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%v %s: %s %s", st.Path, st.Level, st.Message, st.Error))
		}
		return false, strings.Join(seen, "; ")
	})
	if got := get(port, "/"); got.code != http.StatusOK {
		t.Errorf("web while other's port is taken: %d %q, want 200", got.code, got.body)
	}

	// The Service goes: so does its listener.
	if err := a.cs.CoreV1().Services("shop").Delete(t.Context(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the listener of shop/web closed", func() (bool, string) {
		r := get(port, "/")
		return errors.Is(r.err, syscall.ECONNREFUSED), fmt.Sprintf("%+v", r)
	})
}

// TestHealthCheckNodePortLimits: a health check node port is reachable
// from outside the node; it caps the header and the connections it serves
// at once.
func TestHealthCheckNodePortLimits(t *testing.T) {
	a := start(t)
	port := freePort(t)
	if err := k8sclienttest.Create(a.cs, lbService("web", int32(port))); err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, port, http.StatusServiceUnavailable, 0)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	netlimittest.HeaderCapped(t, addr, "/", netlimit.Default.MaxHeaderBytes)
	netlimittest.ConnCapped(t, addr, "/", netlimit.Default.MaxConns)
}

// TestHealthCheckNodePortInvalid: a healthCheckNodePort out of range is
// reported by the loadbalancer cell with the field and the value, and no
// port is served; the Service's frontends stand.
func TestHealthCheckNodePortInvalid(t *testing.T) {
	a := start(t)
	if err := k8sclienttest.Create(a.cs, lbService("web", 70000)); err != nil {
		t.Fatal(err)
	}
	const want = "Service shop/web: spec.healthCheckNodePort: 70000 out of range: want 1 to 65535"
	celltest.Eventually(t, "health naming spec.healthCheckNodePort", func() (bool, string) {
		var seen []string
		for st := range a.health.All(a.db.ReadTxn()) {
			if st.Path[0] == "loadbalancer" && strings.Contains(st.Error, want) {
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%v %s: %s %s", st.Path, st.Level, st.Message, st.Error))
		}
		return false, strings.Join(seen, "; ")
	})
	svc, _, found := a.services.Get(a.db.ReadTxn(), loadbalancer.ServiceByName.Query(loadbalancer.ServiceName{Namespace: "shop", Name: "web"}))
	if !found || svc.HealthCheckNodePort != 0 || len(svc.Ports) != 1 {
		t.Fatalf("services row %+v, want the service without a health check port", svc)
	}
	celltest.Eventually(t, "lb-healthcheck serving no port", func() (bool, string) {
		var seen []string
		for st := range a.health.All(a.db.ReadTxn()) {
			if st.Path[0] == "lb-healthcheck" && st.Level == cell.StatusOK && st.Message == "Serving 0 health check node ports" {
				return true, ""
			}
			seen = append(seen, fmt.Sprintf("%v %s: %s %s", st.Path, st.Level, st.Message, st.Error))
		}
		return false, strings.Join(seen, "; ")
	})
}

// TestHealthCheckNodePortChanges: a changed healthCheckNodePort moves the
// listener; a Service that no longer has externalTrafficPolicy Local loses
// it.
func TestHealthCheckNodePortChanges(t *testing.T) {
	a := start(t)
	p1, p2 := freePort(t), freePort(t)
	svc := lbService("web", int32(p1))
	if err := k8sclienttest.Create(a.cs, svc); err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, p1, http.StatusServiceUnavailable, 0)

	svc.Spec.HealthCheckNodePort = int32(p2)
	if err := k8sclienttest.Update(a.cs, svc); err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, p2, http.StatusServiceUnavailable, 0)
	if got := get(p1, "/"); !errors.Is(got.err, syscall.ECONNREFUSED) {
		t.Errorf("old port %d after the move: %d %q %v, want the connection refused", p1, got.code, got.body, got.err)
	}

	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	if err := k8sclienttest.Update(a.cs, svc); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "the listener closed with traffic policy Cluster", func() (bool, string) {
		r := get(p2, "/")
		return errors.Is(r.err, syscall.ECONNREFUSED), fmt.Sprintf("%+v", r)
	})
}

// TestHealthCheckNodePortDisabled: with --enable-health-check-nodeport=false
// no port is served, and the cell says so in health.
func TestHealthCheckNodePortDisabled(t *testing.T) {
	a, h := newAgent(func(c *lbhealthcheck.Config) {
		c.EnableHealthCheckNodeport = false
		c.HealthCheckNodeportBindAddress = "127.0.0.1"
	})
	celltest.Start(t, h)
	port := freePort(t)
	if err := k8sclienttest.Create(a.cs, lbService("web", int32(port))); err != nil {
		t.Fatal(err)
	}
	celltest.Eventually(t, "shop/web in the services table", func() (bool, string) {
		n := a.services.NumObjects(a.db.ReadTxn())
		return n == 1, fmt.Sprint(n, " services")
	})
	if got := get(port, "/"); !errors.Is(got.err, syscall.ECONNREFUSED) {
		t.Errorf("port %d while disabled: %d %q %v, want the connection refused", port, got.code, got.body, got.err)
	}
	st, _, found := a.health.Get(a.db.ReadTxn(), health.StatusID.Query("lb-healthcheck"))
	if !found || st.Message != "Disabled (--enable-health-check-nodeport=false)" {
		t.Errorf("health of lb-healthcheck %+v, want Disabled", st)
	}
}

// TestHealthCheckNodePortBadBindAddress: a bind address that is no IP
// address stops the hive with an error naming the flag.
func TestHealthCheckNodePortBadBindAddress(t *testing.T) {
	_, h := newAgent(func(c *lbhealthcheck.Config) { c.HealthCheckNodeportBindAddress = "node-1" })
	err := h.Populate(hivetest.Logger(t))
	const want = `invalid --health-check-nodeport-bind-address "node-1": want an IP address`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("populate: %v, want an error containing %q", err, want)
	}
}

// TestHealthCheckNodePortSharedBackend: a pod that backs two Services is in
// a backends row of each; when the Service with the health check stops
// listing it, the count drops to 0 while the other Service keeps it.
func TestHealthCheckNodePortSharedBackend(t *testing.T) {
	a := start(t)
	port := freePort(t)
	if err := k8sclienttest.Create(a.cs, lbService("web", int32(port))); err != nil {
		t.Fatal(err)
	}
	other := lbService("other", 0)
	other.Spec.ClusterIP = "10.96.0.21"
	other.Spec.Ports[0].NodePort = 30081
	if err := k8sclienttest.Create(a.cs, other); err != nil {
		t.Fatal(err)
	}
	for _, svc := range []string{"other", "web"} {
		if err := k8sclienttest.Create(a.cs, slice(svc, endpoint{"10.244.1.5", nodeName})); err != nil {
			t.Fatal(err)
		}
	}
	waitAnswer(t, port, http.StatusOK, 1)

	if err := k8sclienttest.Update(a.cs, slice("web")); err != nil {
		t.Fatal(err)
	}
	waitAnswer(t, port, http.StatusServiceUnavailable, 0)
	rows := slices.Collect(statedb.ToSeq(a.backends.All(a.db.ReadTxn())))
	if len(rows) != 1 || rows[0].ServiceName.Name != "other" || len(rows[0].Backends) != 2 {
		t.Errorf("backends rows %v, want other's with its two ports", rows)
	}
}
