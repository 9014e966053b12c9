package k8sapi

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/pkg/etcdtest"
	"github.com/cellium/cellium/pkg/kubeapitest"
)

// The CRDs the agent installs are those deploy/ ships.
func TestDeployCRDsAreTheAgents(t *testing.T) {
	deploy, err := os.ReadFile(filepath.Join("..", "..", "deploy", "crds.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(deploy, CRDsYAML) {
		t.Fatal("deploy/crds.yaml differs from pkg/k8sapi/crds.yaml: copy it (cp pkg/k8sapi/crds.yaml deploy/)")
	}
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{ResourceIdentities + "." + Group: true, ResourceEndpoints + "." + Group: true}
	for _, c := range crds {
		if !want[c.GetName()] || crdVersion(c) < 1 {
			t.Errorf("CRD %s (version label %q): want one of %v with a version", c.GetName(), c.GetLabels()[LabelCRDVersion], want)
		}
		delete(want, c.GetName())
	}
	if len(want) > 0 {
		t.Errorf("crds.yaml lacks %v", want)
	}
}

func TestDeepCopyShares(t *testing.T) {
	ep := &CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"x": "y"}},
		Status: EndpointStatus{Identity: 300, Addresses: []string{"10.0.0.1"}, NamedPorts: []NamedPort{{Name: "http", Port: 80, Protocol: "TCP"}}}}
	c := ep.DeepCopyObject().(*CelliumEndpoint)
	c.Labels["x"], c.Status.Addresses[0], c.Status.NamedPorts[0].Port = "z", "10.0.0.2", 81
	if ep.Labels["x"] != "y" || ep.Status.Addresses[0] != "10.0.0.1" || ep.Status.NamedPorts[0].Port != 80 {
		t.Fatalf("the copy shares with the original: %+v", ep)
	}
	id := &CelliumIdentity{Spec: IdentitySpec{Labels: []string{"k8s:a=b"}}}
	ci := id.DeepCopyObject().(*CelliumIdentity)
	ci.Spec.Labels[0] = "k8s:c=d"
	if id.Spec.Labels[0] != "k8s:a=b" {
		t.Fatal("the identity's copy shares its labels")
	}
}

// agentConfig starts a kube-apiserver with deploy/rbac.yaml applied and
// returns the agent service account's config and an admin's.
func agentConfig(t *testing.T) (agent, admin *rest.Config, kas *kubeapitest.Server) {
	if _, err := kubeapitest.Binary(); err != nil {
		t.Skip(err)
	}
	etcd := etcdtest.Start(t)
	kas = kubeapitest.Start(t, etcd.Endpoint())
	kubeapitest.ApplyRBAC(t, kas.Admin, filepath.Join("..", "..", "deploy", "rbac.yaml"), nil)
	return kas.Config(kas.Token(t, kubeapitest.DeployNamespace, "cellium-agent")), kas.Config(kubeapitest.AdminToken), kas
}

// As the DaemonSet's service account, EnsureCRDs installs missing CRDs,
// updates older ones, leaves newer ones, and returns once they serve.
func TestEnsureCRDs(t *testing.T) {
	agentCfg, adminCfg, _ := agentConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	agent, err := NewClient(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := NewClient(adminCfg)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if err := agent.EnsureCRDs(ctx, log); err != nil {
		t.Fatalf("EnsureCRDs with none installed: %v", err)
	}
	// The informers of the client that installed the CRDs list rather
	// than stream (the server makes a streaming list of a kind just
	// created wait a second), as every informer of the agent does
	// (kubeclient.Paged), also one of a client that found them installed.
	if streams(agent.IdentityListWatch()) || streams(agent.EndpointListWatch("")) {
		t.Error("the informers of the client that installed the CRDs stream their listings")
	}
	later, err := NewClient(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := later.EnsureCRDs(ctx, log); err != nil {
		t.Fatalf("EnsureCRDs with both installed: %v", err)
	}
	if streams(later.IdentityListWatch()) || streams(later.EndpointListWatch("")) {
		t.Error("the informers of a client that found the CRDs installed stream their listings")
	}
	// Served at once: the agent can create and list identities.
	if _, err := agent.CreateIdentity(ctx, &CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "300"}, Spec: IdentitySpec{Labels: []string{"k8s:app=web"}}}); err != nil {
		t.Fatalf("create an identity after EnsureCRDs: %v", err)
	}
	if _, err := agent.CreateIdentity(ctx, &CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "300"}, Spec: IdentitySpec{Labels: []string{"k8s:app=db"}}}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create a taken identity: %v, want AlreadyExists", err)
	}
	if n := agent.RequestCount("create", ResourceIdentities); n != 2 {
		t.Errorf("RequestCount(create, identities) = %d after two creates", n)
	}
	// The schema is enforced: an identity without labels is refused.
	if _, err := admin.CreateIdentity(ctx, &CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "301"}}); !apierrors.IsInvalid(err) {
		t.Fatalf("create an identity with no labels: %v, want Invalid", err)
	}

	// An identity's labels are immutable: a number stands for one label
	// set (a selector cache that saw the number keeps what it selected).
	ids := admin.dyn.Resource(GroupVersion.WithResource(ResourceIdentities))
	u, err := ids.Get(ctx, "300", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.SetLabels(map[string]string{"edited": "yes"})
	if u, err = ids.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update an identity's metadata: %v", err)
	}
	if err := unstructured.SetNestedStringSlice(u.Object, []string{"k8s:app=evil"}, "spec", "labels"); err != nil {
		t.Fatal(err)
	}
	if _, err := ids.Update(ctx, u, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "labels are immutable") {
		t.Fatalf("change an identity's labels: %v, want Invalid: labels are immutable", err)
	}

	crds := admin.dyn.Resource(crdResource)
	setVersion := func(name, version string) {
		t.Helper()
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		u.SetLabels(map[string]string{LabelCRDVersion: version})
		if _, err := crds.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	version := func(name string) string {
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return u.GetLabels()[LabelCRDVersion]
	}
	idCRD, epCRD := ResourceIdentities+"."+Group, ResourceEndpoints+"."+Group
	setVersion(idCRD, "0")
	setVersion(epCRD, "99")
	if err := agent.EnsureCRDs(ctx, log); err != nil {
		t.Fatalf("EnsureCRDs with an old and a new CRD: %v", err)
	}
	if v := version(idCRD); v != "2" {
		t.Errorf("older CRD %s: version %s after EnsureCRDs, want it updated to 2", idCRD, v)
	}
	if v := version(epCRD); v != "99" {
		t.Errorf("newer CRD %s: version %s after EnsureCRDs, want it left at 99", epCRD, v)
	}

}

func TestVerbOf(t *testing.T) {
	for _, c := range []struct{ method, url, verb, resource string }{
		{"POST", "https://h/apis/cellium.io/v1alpha1/namespaces/default/celliumendpoints", "create", "celliumendpoints"},
		{"PUT", "https://h/apis/cellium.io/v1alpha1/namespaces/default/celliumendpoints/web", "update", "celliumendpoints"},
		{"GET", "https://h/apis/cellium.io/v1alpha1/celliumidentities?watch=true", "watch", "celliumidentities"},
		{"GET", "https://h/apis/cellium.io/v1alpha1/celliumidentities", "list", "celliumidentities"},
		{"GET", "https://h/apis/cellium.io/v1alpha1/celliumidentities/300", "get", "celliumidentities"},
		{"DELETE", "https://h/apis/cellium.io/v1alpha1/celliumidentities/300", "delete", "celliumidentities"},
		{"GET", "https://h/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x", "get", "customresourcedefinitions"},
	} {
		r, _ := http.NewRequest(c.method, c.url, nil)
		if verb, res := verbOf(r); verb != c.verb || res != c.resource {
			t.Errorf("%s %s = %s %s, want %s %s", c.method, c.url, verb, res, c.verb, c.resource)
		}
	}
}

// streams says whether an informer over lw streams its listings (client-go
// asks the ListerWatcher whether it cannot).
func streams(lw cache.ListerWatcher) bool {
	u, ok := lw.(interface{ IsWatchListSemanticsUnSupported() bool })
	return !ok || !u.IsWatchListSemanticsUnSupported()
}

// As the DaemonSet's service account, the Lease of the identity
// collector's election travels as protobuf (a built-in kind: create, get,
// update), and the custom resources as JSON, their only encoding.
func TestWireFormats(t *testing.T) {
	agentCfg, _, _ := agentConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := kubeapitest.RecordWire(agentCfg)
	agent, err := NewClient(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.EnsureCRDs(ctx, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	leases := agent.Leases(kubeapitest.DeployNamespace)
	holder := "node-1"
	lease, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "wire"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder = "node-2"
	lease.Spec.HolderIdentity = &holder
	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := leases.Get(ctx, "wire", metav1.GetOptions{}); err != nil || *got.Spec.HolderIdentity != "node-2" {
		t.Fatalf("lease after update: %v, %v", got, err)
	}
	if _, err := agent.CreateIdentity(ctx, &CelliumIdentity{ObjectMeta: metav1.ObjectMeta{Name: "300"},
		Spec: IdentitySpec{Labels: []string{"k8s:app=wire"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := agent.ListIdentities(ctx); err != nil {
		t.Fatal(err)
	}

	counted := map[string]int{}
	for _, e := range w.Exchanges() {
		var want string
		switch {
		case strings.HasPrefix(e.Path, "/apis/coordination.k8s.io/"):
			want = kubeapitest.Protobuf
		case strings.HasPrefix(e.Path, "/apis/"+Group+"/"):
			want = "application/json"
		default:
			continue // the CRDs' installation
		}
		counted[want]++
		if e.Status < 300 && e.ResponseType != want {
			t.Errorf("%s %s: response %q, want %q", e.Method, e.Path, e.ResponseType, want)
		}
		if (e.Method == http.MethodPost || e.Method == http.MethodPut) && e.RequestType != want {
			t.Errorf("%s %s: request body %q, want %q", e.Method, e.Path, e.RequestType, want)
		}
	}
	if counted[kubeapitest.Protobuf] < 3 || counted["application/json"] < 2 {
		t.Errorf("exchanges by expected type %v: want the Lease's 3 and the identities' 2", counted)
	}
}
