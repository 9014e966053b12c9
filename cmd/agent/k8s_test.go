package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/apiv1"
	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/kubeapitest"
	"github.com/cellium/cellium/pkg/polltest"
)

// deployNamespace is where deploy/kustomization.yaml puts everything.
const deployNamespace = "kube-system"

// agentPermissions is what the agent does with the API server: its
// reflectors (Services, EndpointSlices, its Node, the pods of its node),
// the crd identity mode and, with the nodes cell, its Node's annotations and NetworkUnavailable
// condition (patch nodes, patch nodes/status).
var agentPermissions = []authorizationv1.ResourceAttributes{
	{Verb: "list", Resource: "services"}, {Verb: "watch", Resource: "services"},
	{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"}, {Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
	{Verb: "get", Resource: "nodes"}, {Verb: "list", Resource: "nodes"}, {Verb: "watch", Resource: "nodes"},
	{Verb: "list", Resource: "pods"}, {Verb: "watch", Resource: "pods"},
	{Verb: "patch", Resource: "nodes"}, {Verb: "patch", Resource: "nodes", Subresource: "status"},
	// crd identity mode: its CRDs, identities, endpoint objects and the
	// collector's Lease.
	{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	{Verb: "get", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Name: "celliumidentities.cellium.io"},
	{Verb: "update", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions", Name: "celliumendpoints.cellium.io"},
	{Verb: "create", Group: "cellium.io", Resource: "celliumidentities"}, {Verb: "watch", Group: "cellium.io", Resource: "celliumidentities"},
	{Verb: "delete", Group: "cellium.io", Resource: "celliumidentities"},
	{Verb: "update", Group: "cellium.io", Resource: "celliumendpoints"}, {Verb: "list", Group: "cellium.io", Resource: "celliumendpoints"},
	{Verb: "update", Group: "coordination.k8s.io", Resource: "leases"},
}

// TestKubeAPIServer runs the agent against a real kube-apiserver, as the
// DaemonSet does: deploy/rbac.yaml applied, the agent authenticated as its
// service account. Services, EndpointSlices and the Node written through
// the API reach the BPF maps and the IPAM; a ClusterRole without a verb the
// agent needs fails with a message naming it.
func TestKubeAPIServer(t *testing.T) {
	requireRoot(t)
	if _, err := kubeapitest.Binary(); err != nil {
		t.Skip(err)
	}
	etcd := etcdtest.Start(t)
	kas := kubeapitest.Start(t, etcd.Endpoint())
	ctx := context.Background()
	applyRBAC(t, kas.Admin, nil)
	token := kas.Token(t, deployNamespace, "cellium-agent")
	sa, err := kubernetes.NewForConfig(kas.Config(token))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPermissions(sa); err != nil {
		t.Fatal(err)
	}

	const nodeName = "k8s-test-node"
	podCIDR := "10.252.7.0/24"
	// Registered as kubelet --register-with-taints would, and with the
	// condition a cloud route controller sets before any route exists.
	node, err := kas.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}},
		Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR},
			Taints: []corev1.Taint{{Key: nodes.TaintAgentNotReady, Effect: corev1.TaintEffectNoSchedule}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "NoRouteCreated"}}
	if _, err := kas.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := createService(t, kas.Admin, "web", "192.0.2.10")

	env := newAgentEnv(t)
	kubeconfig := filepath.Join(env.dir, "kubeconfig")
	kas.WriteKubeconfig(t, kubeconfig, token)
	// With the crd identity mode the agent installs its CRDs and informs
	// on them too.
	k8sFlags := []string{"--k8s-mode", "kubeconfig", "--kubeconfig", kubeconfig, "--node-name", nodeName, "--ipam", "kubernetes",
		"--identity-allocation-mode", "crd"}
	// Asked before the agent starts: the probe is a streaming list.
	noStreaming := watchListUnsupported(t, kas)
	streamsBefore := watchLists(t, kas)
	agent := startAgent(t, append(env.runFlags(), k8sFlags...)...)
	agent.waitFor("Started hive")
	go drainLogs(agent.logs)
	waitAgentReady(t, "the agent", env.socket, time.Minute)

	// Nothing of the k8s-client module runs in this mode (the informers
	// are their cells'), and its health says so: OK, naming the server.
	h, _ := agentHealth(t, env.socket)
	want := "Kubernetes API at " + kas.URL + " (kubeconfig); each watcher reports its own state"
	i := slices.IndexFunc(h.Modules, func(n apiv1.HealthNode) bool { return n.ID == "k8s-client" })
	if i < 0 {
		t.Errorf("no k8s-client in the agent's health: %+v", h.Modules)
	} else if m := h.Modules[i]; m.Level != apiv1.LevelOK || m.Message != want {
		t.Errorf("health of k8s-client in kubeconfig mode: %s %q, want OK %q", m.Level, m.Message, want)
	}

	// The Service from the API server in the maps, and the pod CIDR from
	// the Node in the IPAM.
	waitDump(t, env.socket, "cellium_lb4_services", web+":80")

	// Even where the API server streams lists, every informer and
	// reflector of the agent lists in pages (kubeclient.Paged: gzip'd; a
	// stream's events are not, ten times the bytes and more of the
	// server's CPU at 20,000 Services: docs/performance.md): Services,
	// EndpointSlices, Nodes, Pods, Namespaces, NetworkPolicies and the
	// CRD kinds. The server counts streaming lists in
	// apiserver_watch_list_duration_seconds, by resource.
	if noStreaming != "" {
		t.Logf("not checking that the agent does not stream its listings: %s", noStreaming)
	} else {
		// Wait for every informer's first listing, a LIST or a
		// streaming list, before counting the streaming ones.
		poll(t, "the agent's informers of every kind listed", func() (bool, string) {
			lists, streams := listRequests(t, kas), watchLists(t, kas)
			var missing []string
			for _, resource := range informedResources {
				if lists[resource] == 0 && streams[resource] == streamsBefore[resource] {
					missing = append(missing, resource)
				}
			}
			return len(missing) == 0, fmt.Sprintf("no list of %v yet", missing)
		})
		streams := watchLists(t, kas)
		for resource, n := range streams {
			if n != streamsBefore[resource] {
				t.Errorf("the agent's start streamed a list of %s (the server counts %v streaming lists of them, %v before)",
					resource, n, streamsBefore[resource])
			}
		}
	}
	var allocs []apiv1.IPAMAllocation
	out, _, _ := agentCmd(t, "ipam", "list", "-o", "json", "--api-socket", env.socket)
	if err := json.Unmarshal([]byte(out), &allocs); err != nil ||
		!slices.ContainsFunc(allocs, func(a apiv1.IPAMAllocation) bool { return a.IP == "10.252.7.1" && a.State == apiv1.AllocationRouter }) {
		t.Errorf("agent ipam list: want the router of the Node's pod CIDR %s:\n%s", podCIDR, out)
	}

	// The agent, as the DaemonSet's service account, annotated its Node,
	// set NetworkUnavailable=False and removed the not-ready taint.
	poll(t, "the Node annotated, marked ready and untainted by the agent", func() (bool, string) {
		n, err := kas.Admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		available := slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse && c.Reason == "CelliumIsUp"
		})
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == nodes.TaintAgentNotReady })
		return available && !tainted && n.Annotations[nodes.AnnotationPodCIDRs] == podCIDR &&
			n.Annotations[nodes.AnnotationRoutingMode] == "tunnel", fmt.Sprintf("%+v %+v %v", n.Annotations, n.Status.Conditions, n.Spec.Taints)
	})

	// Changes through the API reach the maps: a new Service, a removed one.
	api := createService(t, kas.Admin, "api", "192.0.2.11")
	waitDump(t, env.socket, "cellium_lb4_services", api+":80")
	if err := kas.Admin.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitDumpWithout(t, env.socket, "cellium_lb4_services", web+":80")
	agent.stop()

	// Without list and watch on EndpointSlices (a streaming list needs
	// watch, the pages where the server cannot stream list), the agent
	// never syncs: both the permission check and the agent say what is
	// missing.
	applyRBAC(t, kas.Admin, func(rule *rbacv1.PolicyRule) {
		if slices.Contains(rule.Resources, "endpointslices") {
			rule.Verbs = slices.DeleteFunc(rule.Verbs, func(v string) bool { return v == "list" || v == "watch" })
		}
	})
	err = checkPermissions(sa)
	if err == nil || !strings.Contains(err.Error(), "cannot list endpointslices.discovery.k8s.io") {
		t.Fatalf("permission check without list on endpointslices = %v, want it to name the verb and resource", err)
	}
	env2 := newAgentEnv(t)
	kas.WriteKubeconfig(t, kubeconfig, token)
	// It logs the refusals as errors: not a failure here.
	agent = startAgent(t, append(env2.runFlags(), k8sFlags...)...)
	go drainLogs(agent.logs)
	// Its health names the refusal, and it stays not ready: the probe
	// says so too.
	var seen string
	poll(t, "the agent without list and watch on endpointslices not ready, its health naming the forbidden endpointslices", func() (bool, string) {
		h, last := agentHealth(t, env2.socket)
		named := slices.ContainsFunc(healthErrors(h), func(e string) bool {
			return strings.Contains(e, "forbidden") && strings.Contains(e, "endpointslices")
		})
		code, body := readyz(env2.healthAddr)
		seen = fmt.Sprintf("%s; /readyz: %d %s", last, code, body)
		return named && !h.Ready && code == http.StatusServiceUnavailable, seen
	})
	t.Logf("as expected: %s", seen)
}

// applyRBAC creates or updates deploy/rbac.yaml's objects in the deploy
// namespace, each ClusterRole rule passed through edit first if not nil.
func applyRBAC(t testing.TB, admin *kubernetes.Clientset, edit func(*rbacv1.PolicyRule)) {
	t.Helper()
	kubeapitest.ApplyRBAC(t, admin, filepath.Join("..", "..", "deploy", "rbac.yaml"), edit)
}

// checkPermissions asks the API server, as the agent, whether it may do
// everything in agentPermissions, and names what it may not.
func checkPermissions(sa *kubernetes.Clientset) error {
	var missing []string
	for _, attrs := range agentPermissions {
		review, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(context.Background(),
			&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}},
			metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("access review: %w", err)
		}
		if !review.Status.Allowed {
			what := attrs.Resource
			if attrs.Group != "" {
				what += "." + attrs.Group
			}
			if attrs.Subresource != "" {
				what += "/" + attrs.Subresource
			}
			missing = append(missing, "cannot "+attrs.Verb+" "+what)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("deploy/rbac.yaml does not let the agent's service account do what the agent needs: %s", strings.Join(missing, ", "))
	}
	return nil
}

// createService creates a ClusterIP Service and its EndpointSlice (no
// controller manager runs) with one backend, and returns the cluster IP the
// API server allocated.
func createService(t *testing.T, admin *kubernetes.Clientset, name, backend string) string {
	t.Helper()
	ctx := context.Background()
	svc, err := admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready, port, proto, portName := true, int32(8080), corev1.ProtocolTCP, "http"
	if _, err := admin.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{backend}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// waitAgentReady waits until the health of the agent (what) says ready,
// and fails the test after timeout with what it last said: the barriers it waits
// for and every error its health reports.
func waitAgentReady(t *testing.T, what, socket string, timeout time.Duration) {
	t.Helper()
	polltest.Until(t, what+" ready", timeout, 100*time.Millisecond, func() (bool, string) {
		h, last := agentHealth(t, socket)
		return h.Ready, last
	})
}

// agentHealth is the agent's health as `agent status` prints it, and a
// line saying what it was: not ready, waiting for which barriers, with
// which errors, or why there was none.
func agentHealth(t *testing.T, socket string) (apiv1.Health, string) {
	t.Helper()
	var h apiv1.Health
	out, errOut, code := agentCmd(t, "status", "-o", "json", "--api-socket", socket)
	if code != 0 {
		return h, fmt.Sprintf("agent status: exit %d: %s", code, strings.TrimSpace(errOut))
	}
	if err := json.Unmarshal([]byte(out), &h); err != nil {
		return h, fmt.Sprintf("agent status: %v: %q", err, out)
	}
	return h, fmt.Sprintf("ready %v, waiting for %v; health errors: [%s]", h.Ready, h.Pending, strings.Join(healthErrors(h), "; "))
}

// healthErrors are the errors of h's modules and their scopes, each as
// "id: error".
func healthErrors(h apiv1.Health) []string {
	var errs []string
	var walk func([]apiv1.HealthNode)
	walk = func(nodes []apiv1.HealthNode) {
		for _, n := range nodes {
			if n.Error != "" {
				errs = append(errs, n.ID+": "+n.Error)
			}
			walk(n.Children)
		}
	}
	walk(h.Modules)
	return errs
}

// readyz is the status code and body of the agent's /readyz at addr; 0
// and the error when it does not answer.
func readyz(addr string) (int, string) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

func waitDump(t *testing.T, socket, name, substr string) {
	t.Helper()
	poll(t, name+" with "+substr, func() (bool, string) {
		out, errOut, code := agentCmd(t, "map", "dump", name, "--api-socket", socket)
		return code == 0 && strings.Contains(out, substr), out + errOut
	})
}

// drainLogs reads an agent's log lines until it exits. It takes the
// channel, not the agentProc: the test starts another agent in the same
// variable.
func drainLogs(logs <-chan map[string]any) {
	for range logs {
	}
}

// watchListUnsupported asks the API server for a streaming list of
// Namespaces and returns why it refused, or "" when it streams. Its
// watch cache needs etcd's progress notifications for one (etcd 3.4.31,
// 3.5.13 or later): Debian's etcd 3.4.23 has them not, and kube-apiserver
// then says so in the stream's first event.
func watchListUnsupported(t testing.TB, kas *kubeapitest.Server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := kas.Admin.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		return err.Error()
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			return apierrors.FromObject(ev.Object).Error()
		case watch.Bookmark:
			return ""
		}
	}
	return "the streaming list ended before its bookmark"
}

// informedResources are the kinds the agent informs on, in the crd
// identity mode.
var informedResources = []string{"services", "endpointslices", "nodes", "pods", "celliumidentities", "celliumendpoints"}

// watchLists is how many streaming lists of each resource the API server
// has served.
func watchLists(t testing.TB, kas *kubeapitest.Server) map[string]float64 {
	t.Helper()
	return metricByResource(t, kas, "apiserver_watch_list_duration_seconds_count")
}

// listRequests is how many LIST requests of each resource the API server
// has served.
func listRequests(t testing.TB, kas *kubeapitest.Server) map[string]float64 {
	t.Helper()
	return metricByResource(t, kas, "apiserver_request_total", `verb="LIST"`)
}

// metricByResource sums the samples of the API server's metric whose
// labels include every one of labels, by their resource label.
func metricByResource(t testing.TB, kas *kubeapitest.Server, metric string, labels ...string) map[string]float64 {
	t.Helper()
	metrics, err := kas.Admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for line := range strings.Lines(string(metrics)) {
		rest, ok := strings.CutPrefix(line, metric+"{")
		if !ok {
			continue
		}
		set, _, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		_, resource, ok := strings.Cut(set, `resource="`)
		if !ok {
			continue
		}
		resource, _, _ = strings.Cut(resource, `"`)
		if _, seen := counts[resource]; !seen {
			counts[resource] = metricSum(string(metrics), metric, append([]string{`resource="` + resource + `"`}, labels...)...)
		}
	}
	return counts
}

// metricSum is the sum of the samples of a Prometheus text exposition's
// metric whose labels include every one of labels (`name="value"`).
func metricSum(exposition, metric string, labels ...string) float64 {
	var sum float64
	for line := range strings.Lines(exposition) {
		rest, ok := strings.CutPrefix(line, metric+"{")
		if !ok {
			continue
		}
		set, value, ok := strings.Cut(rest, "} ")
		if !ok || !hasAll(set, labels) {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			sum += v
		}
	}
	return sum
}

func hasAll(labelSet string, labels []string) bool {
	for _, l := range labels {
		if !strings.Contains(","+labelSet+",", ","+l+",") {
			return false
		}
	}
	return true
}
