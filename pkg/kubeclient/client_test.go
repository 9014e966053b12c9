package kubeclient

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cellium/cellium/pkg/kubeapitest"
)

// Against a real kube-apiserver, every method of a client does what
// client-go's generated client's does, with the same requests: the
// method and path (the status subresource for UpdateStatus and a status
// patch), protobuf bodies and answers for the built-in kinds (a patch's
// body its patch type), a list's label selector, a watch's events.
func TestClientOfAPIServer(t *testing.T) {
	kas := kubeapitest.StartOnEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := kas.Config(kubeapitest.AdminToken)
	wire := kubeapitest.RecordWire(cfg)
	src, err := NewRESTSource(cfg, mustHTTPClient(t, cfg), corev1.SchemeGroupVersion)
	if err != nil {
		t.Fatal(err)
	}
	nodes := New(src, "nodes", "Node", "", func(l *corev1.NodeList) *[]corev1.Node { return &l.Items })

	created, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"role": "a"}}}, metav1.CreateOptions{})
	if err != nil || created.Name != "n1" || created.UID == "" {
		t.Fatalf("create: %v %+v", err, created)
	}
	// From the creation's resource version, which the API server's watch
	// cache has seen (or soon will): a watch from "" on a new server can
	// be ahead of its cache of an empty resource.
	w, err := nodes.Watch(ctx, metav1.ListOptions{ResourceVersion: created.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	created.Spec.PodCIDR = "10.244.1.0/24"
	if _, err := nodes.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil || got.Spec.PodCIDR != "10.244.1.0/24" {
		t.Fatalf("get after update: %v %+v", err, got.Spec)
	}
	got.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "Test"}}
	if _, err := nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	patched, err := nodes.Patch(ctx, "n1", types.StrategicMergePatchType,
		[]byte(`{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"Patched"}]}}`), metav1.PatchOptions{}, "status")
	if err != nil || len(patched.Status.Conditions) != 1 || patched.Status.Conditions[0].Reason != "Patched" {
		t.Fatalf("status patch: %v %+v", err, patched.Status.Conditions)
	}
	list, err := nodes.List(ctx, metav1.ListOptions{LabelSelector: "role=a"})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "n1" || list.ResourceVersion == "" {
		t.Fatalf("list role=a: %v %+v", err, list)
	}
	if err := nodes.Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Get(ctx, "n2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
	if err := nodes.Delete(ctx, "n2", metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("second delete: %v, want NotFound", err)
	}

	want := []string{"ADDED n2", "MODIFIED n1", "MODIFIED n1", "MODIFIED n1", "DELETED n2"}
	var events []string
	deadline := time.After(30 * time.Second)
	for len(events) < len(want) {
		select {
		case ev := <-w.ResultChan():
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				t.Fatalf("watch event %s of a %T: %+v", ev.Type, ev.Object, ev.Object)
			}
			events = append(events, string(ev.Type)+" "+n.Name)
		case <-deadline:
			t.Fatalf("watch events %v, want %v", events, want)
		}
	}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Errorf("watch events %v, want %v", events, want)
	}

	seen := map[string]bool{}
	for _, e := range wire.Exchanges() {
		what := e.Method + " " + e.Path
		if strings.Contains(e.Query, "watch=true") {
			what += " (watch)"
		}
		if strings.Contains(e.Query, "labelSelector=role") {
			what += " (role=a)"
		}
		seen[what] = true
		if !strings.HasPrefix(e.ResponseType, kubeapitest.Protobuf) {
			t.Errorf("%s: answered %q, want %q", what, e.ResponseType, kubeapitest.Protobuf)
		}
		switch e.Method {
		case http.MethodPost, http.MethodPut:
			if e.RequestType != kubeapitest.Protobuf {
				t.Errorf("%s: body %q, want %q", what, e.RequestType, kubeapitest.Protobuf)
			}
		case http.MethodPatch:
			if e.RequestType != string(types.StrategicMergePatchType) {
				t.Errorf("%s: body %q, want %q", what, e.RequestType, types.StrategicMergePatchType)
			}
		}
	}
	for _, what := range []string{
		"GET /api/v1/nodes (watch)", "POST /api/v1/nodes", "PUT /api/v1/nodes/n1", "GET /api/v1/nodes/n1",
		"PUT /api/v1/nodes/n1/status", "PATCH /api/v1/nodes/n1/status", "GET /api/v1/nodes (role=a)", "DELETE /api/v1/nodes/n2",
	} {
		if !seen[what] {
			t.Errorf("no request %s; the requests: %v", what, seen)
		}
	}
}

// A Server's list is filtered by the options' label selector, as
// client-go's fake clients filter it, keeping its list metadata; a
// selector that does not parse is an error naming it.
func TestListOfServerSelectsLabels(t *testing.T) {
	server := listServer{&corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "7"}, Items: testServices(4)}}
	c := New(NewServedSource(server, corev1.SchemeGroupVersion), "services", "Service", "", func(l *corev1.ServiceList) *[]corev1.Service { return &l.Items })
	l, err := c.List(context.Background(), metav1.ListOptions{LabelSelector: "app in (1,3)"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range l.Items {
		names = append(names, s.Name)
	}
	if fmt.Sprint(names) != "[svc-1 svc-3]" || l.ResourceVersion != "7" {
		t.Errorf("list app in (1,3): %v at %q, want [svc-1 svc-3] at 7", names, l.ResourceVersion)
	}
	if _, err := c.List(context.Background(), metav1.ListOptions{LabelSelector: "app in (("}); err == nil || !strings.Contains(err.Error(), `"app in (("`) {
		t.Errorf("list with a broken selector: %v, want an error naming it", err)
	}
}
