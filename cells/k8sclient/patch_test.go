package k8sclient_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cellium/cellium/cells/k8sclient"
)

// The patches the agent's cells send change the stored object as an API
// server would: the nodes cell's merge patch of annotations, its strategic
// merge patch of the NetworkUnavailable condition (merged into the
// conditions by type), and its JSON patch testing and replacing the
// taints, which fails, changing nothing, once the taints changed.
func TestEmbeddedPatches(t *testing.T) {
	ctx := context.Background()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"keep": "1", "drop": "2"}},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24", Taints: []corev1.Taint{
			{Key: "other", Effect: corev1.TaintEffectNoSchedule}, {Key: "not-ready", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
			{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "NoRouteCreated"},
		}},
	}
	_, cs, err := k8sclient.NewEmbedded(node)
	if err != nil {
		t.Fatal(err)
	}
	nodes := cs.CoreV1().Nodes()

	if _, err := nodes.Patch(ctx, "n1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"drop":null,"added":"3"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Patch(ctx, "n1", types.StrategicMergePatchType,
		[]byte(`{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":"CelliumIsUp"},{"type":"New","status":"True"}]}}`),
		metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	replace := `[{"op":"test","path":"/spec/taints","value":[{"key":"other","effect":"NoSchedule"},{"key":"not-ready","effect":"NoSchedule"}]},` +
		`{"op":"replace","path":"/spec/taints","value":[{"key":"other","effect":"NoSchedule"}]}]`
	patched, err := nodes.Patch(ctx, "n1", types.JSONPatchType, []byte(replace), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := nodes.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := node.DeepCopy()
	want.Annotations = map[string]string{"keep": "1", "added": "3"}
	want.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"},
		{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "CelliumIsUp"},
		{Type: "New", Status: corev1.ConditionTrue},
	}
	want.Spec.Taints = want.Spec.Taints[:1]
	for what, n := range map[string]*corev1.Node{"returned": patched, "stored": got} {
		n.TypeMeta = metav1.TypeMeta{}
		if !equality.Semantic.DeepEqual(n, want) {
			t.Errorf("%s after the patches:\n%+v\nwant\n%+v", what, n, want)
		}
	}

	// The same test-and-replace again: the taints changed, so it fails.
	if _, err := nodes.Patch(ctx, "n1", types.JSONPatchType, []byte(replace), metav1.PatchOptions{}); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("JSON patch whose test fails: %v, want the test's failure", err)
	}
	if again, _ := nodes.Get(ctx, "n1", metav1.GetOptions{}); len(again.Spec.Taints) != 1 {
		t.Errorf("a failed JSON patch changed the taints: %+v", again.Spec.Taints)
	}
}

// What the embedded server cannot apply faithfully without the kinds'
// schemas is refused with a BadRequest naming it, changing nothing:
// server-side apply, a strategic merge of a list it does not know the key
// of, patch directives, JSON patch's move and copy.
func TestEmbeddedPatchesRefused(t *testing.T) {
	ctx := context.Background()
	svc, services := embeddedService(t)
	for _, p := range []struct {
		pt         types.PatchType
		data, want string
	}{
		{types.ApplyPatchType, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","labels":{"x":"y"}}}`, "not supported by the embedded API server"},
		{types.StrategicMergePatchType, `{"spec":{"ports":[{"name":"http","port":81}]}}`, "list spec.ports"},
		{types.StrategicMergePatchType, `{"metadata":{"labels":{"$patch":"replace"}}}`, "directive $patch"},
		{types.JSONPatchType, `[{"op":"move","from":"/spec/clusterIP","path":"/spec/x"}]`, `"move"`},
		{types.MergePatchType, `[1]`, "not a JSON object"},
	} {
		_, err := services.Patch(ctx, "a", p.pt, []byte(p.data), metav1.PatchOptions{})
		if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), p.want) || !strings.Contains(err.Error(), "services a") {
			t.Errorf("%s patch %s: %v, want a BadRequest naming services a and %s", p.pt, p.data, err, p.want)
		}
	}
	got, err := services.Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.TypeMeta = metav1.TypeMeta{}
	if !equality.Semantic.DeepEqual(got, svc) {
		t.Errorf("after refused patches: %+v, want it unchanged", got)
	}
}

// A JSON patch the embedded server decodes but cannot apply (a path that
// is not there, a test that fails) is answered as the API server answers
// it, 422 Invalid, and changes nothing; test compares numbers by value, as
// RFC 6902 says, so 80.0 passes against 80.
func TestEmbeddedJSONPatchUnprocessable(t *testing.T) {
	ctx := context.Background()
	_, services := embeddedService(t)
	for _, p := range []struct{ data, want string }{
		{`[{"op":"replace","path":"/spec/missing","value":1}]`, `no member "missing"`},
		{`[{"op":"test","path":"/spec/ports/0/port","value":81},{"op":"replace","path":"/spec/clusterIP","value":"10.96.0.11"}]`, "the value differs"},
		{`[{"op":"test","path":"/spec/ports/0/name","value":"http "}]`, "the value differs"},
	} {
		_, err := services.Patch(ctx, "a", types.JSONPatchType, []byte(p.data), metav1.PatchOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), p.want) || !strings.Contains(err.Error(), "services a") {
			t.Errorf("JSON patch %s: %v, want 422 Invalid naming services a and %s", p.data, err, p.want)
		}
	}
	got, err := services.Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.ClusterIP != "10.96.0.10" {
		t.Fatalf("after unprocessable patches clusterIP is %s, want it unchanged", got.Spec.ClusterIP)
	}
	patched, err := services.Patch(ctx, "a", types.JSONPatchType,
		[]byte(`[{"op":"test","path":"/spec/ports/0/port","value":80.0},{"op":"replace","path":"/spec/clusterIP","value":"10.96.0.11"}]`), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("test of 80.0 against 80: %v, want it to pass", err)
	}
	if patched.Spec.ClusterIP != "10.96.0.11" {
		t.Fatalf("after a passed test and a replace clusterIP is %s, want 10.96.0.11", patched.Spec.ClusterIP)
	}
}

// embeddedService is an embedded API server holding one Service, default/a,
// and its client of Services in default.
func embeddedService(t *testing.T) (*corev1.Service, k8sclient.ServiceClient) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "default"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	_, cs, err := k8sclient.NewEmbedded(svc)
	if err != nil {
		t.Fatal(err)
	}
	return svc, cs.CoreV1().Services("default")
}
