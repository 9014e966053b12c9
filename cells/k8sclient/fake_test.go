package k8sclient_test

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cellium/cellium/cells/k8sclient"
)

// A reactor answers the actions of its verb and resource ("*" for any,
// "resource/subresource" for a subresource's), in front of the store; one
// that leaves an action goes on to the next. The Fake records each call
// with its own copy of the object written.
func TestFakeReactors(t *testing.T) {
	ctx := context.Background()
	_, f, err := k8sclient.NewEmbedded(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	if err != nil {
		t.Fatal(err)
	}
	refused := errors.New("status patches refused")
	f.PrependReactor("patch", "nodes/status", func(k8sclient.Action) (bool, runtime.Object, error) { return true, nil, refused })
	seen := 0
	f.PrependReactor("*", "*", func(a k8sclient.Action) (bool, runtime.Object, error) {
		seen++
		return false, nil, nil
	})
	nodes := f.CoreV1().Nodes()
	if _, err := nodes.Patch(ctx, "n1", types.MergePatchType, []byte(`{"status":{"phase":"x"}}`), metav1.PatchOptions{}, "status"); !errors.Is(err, refused) {
		t.Errorf("status patch: %v, want the reactor's %v", err, refused)
	}
	if _, err := nodes.Patch(ctx, "n1", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("patch of the node itself, which the status reactor does not cover: %v", err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
	if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Name = "changed"
	actions := f.Actions()
	if seen != 3 || len(actions) != 3 {
		t.Fatalf("the leaving reactor saw %d calls and %d were recorded, want 3", seen, len(actions))
	}
	if a := actions[2]; a.Verb != "create" || a.Object.(*corev1.Node).Name != "n2" {
		t.Errorf("recorded %s of %v, want the create of n2 as it was written", a.Verb, a.Object)
	}
	f.ClearActions()
	if len(f.Actions()) != 0 {
		t.Error("actions left after ClearActions")
	}
}
