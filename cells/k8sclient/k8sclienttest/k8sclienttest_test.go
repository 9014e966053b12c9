package k8sclienttest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/k8sclient/k8sclienttest"
)

// Objects of any kind, cluster-scoped or namespaced (without a namespace:
// "default"), go in and out through the clientset's reactors.
func TestCreateUpdateDelete(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "objs.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ports: [{port: 80}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := k8sclienttest.DecodeFile(file)
	if err != nil || len(objs) != 2 {
		t.Fatalf("DecodeFile = %d objects, %v; want 2", len(objs), err)
	}
	_, cs, err := k8sclient.NewEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		if err := k8sclienttest.Create(cs, obj); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "team-a", metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace after Create: %v", err)
	}
	svc, err := cs.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("service after Create, in default: %v", err)
	}
	svc = svc.DeepCopy()
	svc.Spec.Ports[0].Port = 8080
	if err := k8sclienttest.Update(cs, svc); err != nil {
		t.Fatal(err)
	}
	if got, _ := cs.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{}); got.Spec.Ports[0].Port != 8080 {
		t.Fatalf("port after Update = %d, want 8080", got.Spec.Ports[0].Port)
	}
	if err := k8sclienttest.Delete(cs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "team-a", metav1.GetOptions{}); err == nil {
		t.Fatal("namespace still there after Delete")
	}
}
