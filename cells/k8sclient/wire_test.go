package k8sclient

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/pkg/kubeapitest"
)

// Against a real kube-apiserver, the built-in kinds travel as protobuf:
// the informers' pages and watch streams of every kind the agent informs
// on, and the bodies of writes (create, update, update of status), while
// a patch keeps its own patch type. kubeclient.New's clients ask for
// protobuf (accepting JSON) when the configuration names no content type,
// as client-go's generated clients do.
func TestBuiltinKindsTravelAsProtobuf(t *testing.T) {
	kas := kubeapitest.StartOnEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cfg := kas.Config(kubeapitest.AdminToken)
	w := kubeapitest.RecordWire(cfg)
	g, err := newGroups(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs := clusterClientset{groups: g, config: cfg}

	// Writes: create, update, update of status, and patches of the
	// three patch types.
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wire-node"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Labels = map[string]string{"updated": "yes"}
	if node, err = cs.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "Wire"}}
	if _, err = cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	patches := []struct {
		pt   types.PatchType
		data string
	}{
		{types.StrategicMergePatchType, `{"metadata":{"annotations":{"strategic":"yes"}}}`},
		{types.MergePatchType, `{"metadata":{"annotations":{"merge":"yes"}}}`},
		{types.JSONPatchType, `[{"op":"add","path":"/metadata/annotations/json","value":"yes"}]`},
	}
	for _, p := range patches {
		if _, err := cs.CoreV1().Nodes().Patch(ctx, "wire-node", p.pt, []byte(p.data), metav1.PatchOptions{}); err != nil {
			t.Fatalf("%s patch: %v", p.pt, err)
		}
	}
	got, err := cs.CoreV1().Nodes().Get(ctx, "wire-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"strategic", "merge", "json"} {
		if got.Annotations[k] != "yes" {
			t.Errorf("node annotations %v: the %s patch is missing", got.Annotations, k)
		}
	}
	if got.Labels["updated"] != "yes" || len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Reason != "Wire" {
		t.Errorf("node %v %v: the update or the status update is missing", got.Labels, got.Status.Conditions)
	}

	// The informers of every built-in kind the agent informs on.
	seen := make(chan string, 16)
	informer := func(inf cache.SharedIndexInformer) cache.SharedIndexInformer {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
			if m, ok := obj.(metav1.Object); ok && m.GetName() == "after-sync" {
				seen <- m.GetNamespace() + "/" + m.GetName()
			}
		}}); err != nil {
			t.Fatal(err)
		}
		return inf
	}
	informers := NewInformers(
		informer(NewInformer(cs, cs.CoreV1().Services(""), &corev1.Service{}, nil)),
		informer(NewInformer(cs, cs.DiscoveryV1().EndpointSlices(""), &discoveryv1.EndpointSlice{}, nil)),
		informer(NewInformer(cs, cs.CoreV1().Pods(""), &corev1.Pod{}, nil)),
		informer(NewInformer(cs, cs.CoreV1().Namespaces(), &corev1.Namespace{}, nil)),
		informer(NewInformer(cs, cs.NetworkingV1().NetworkPolicies(""), &networkingv1.NetworkPolicy{}, nil)),
	)
	informCtx, stop := context.WithCancel(ctx)
	informers.Start(informCtx)
	defer func() { stop(); informers.Shutdown() }()
	for _, inf := range informers.all {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatal("informers not synced")
		}
	}
	// Written after the first lists, these come through the watches: once
	// all five arrived, every watch's response has been read.
	ns := "default"
	// No controller manager makes the namespace's service account, which
	// the admission of a pod needs.
	if _, err := kas.Admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "after-sync"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "after-sync"},
		AddressType: discoveryv1.AddressTypeIPv4}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "after-sync"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "after-sync"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "after-sync"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		select {
		case <-seen:
		case <-ctx.Done():
			t.Fatal("the objects written after the first lists did not all come through the watches")
		}
	}

	lists, watches := map[string]bool{}, map[string]bool{}
	for _, e := range w.Exchanges() {
		if e.Status >= 300 {
			continue
		}
		what := e.Method + " " + e.Path
		watch := strings.Contains(e.Query, "watch=true")
		switch e.Method {
		case http.MethodPost, http.MethodPut:
			if e.RequestType != kubeapitest.Protobuf {
				t.Errorf("%s: request body %q, want %q", what, e.RequestType, kubeapitest.Protobuf)
			}
		case http.MethodPatch:
			if !strings.HasPrefix(e.RequestType, "application/") || !strings.Contains(e.RequestType, "patch") {
				t.Errorf("%s: request body %q, want its patch type", what, e.RequestType)
			}
		}
		if !strings.HasPrefix(e.ResponseType, kubeapitest.Protobuf) {
			t.Errorf("%s (%s): response %q, want %q", what, e.Query, e.ResponseType, kubeapitest.Protobuf)
		}
		if e.Method == http.MethodGet {
			if watch {
				watches[e.Path] = true
			} else {
				lists[e.Path] = true
			}
		}
	}
	for _, path := range []string{"/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices", "/api/v1/pods",
		"/api/v1/namespaces", "/apis/networking.k8s.io/v1/networkpolicies"} {
		if !lists[path] || !watches[path] {
			t.Errorf("%s: listed %v, watched %v; want both", path, lists[path], watches[path])
		}
	}
}
