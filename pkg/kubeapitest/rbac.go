package kubeapitest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// DeployNamespace is where deploy/kustomization.yaml puts everything.
const DeployNamespace = "kube-system"

// ApplyRBAC creates or updates the objects of an RBAC manifest
// (deploy/rbac.yaml: a ServiceAccount, ClusterRoles and
// ClusterRoleBindings) in DeployNamespace, each ClusterRole rule passed
// through edit first if not nil.
func ApplyRBAC(t testing.TB, admin kubernetes.Interface, path string, edit func(*rbacv1.PolicyRule)) {
	t.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s document %d: %v", path, i+1, err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(js, nil, nil)
		if err != nil {
			t.Fatalf("%s document %d: %v", path, i+1, err)
		}
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			o.Namespace = DeployNamespace
			_, err = admin.CoreV1().ServiceAccounts(DeployNamespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			if edit != nil {
				for j := range o.Rules {
					edit(&o.Rules[j])
				}
			}
			var old *rbacv1.ClusterRole
			if old, err = admin.RbacV1().ClusterRoles().Get(ctx, o.Name, metav1.GetOptions{}); err == nil {
				o.ResourceVersion = old.ResourceVersion
				_, err = admin.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
			} else {
				_, err = admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			}
		case *rbacv1.ClusterRoleBinding:
			for j := range o.Subjects {
				if o.Subjects[j].Namespace == "" {
					o.Subjects[j].Namespace = DeployNamespace
				}
			}
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s document %d: unexpected %T", path, i+1, obj)
		}
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatalf("apply %s document %d: %v", path, i+1, err)
		}
	}
}

// AgentKubeconfig applies the RBAC manifest at rbacPath (ApplyRBAC) and
// writes a kubeconfig of the agent's service account (cellium-agent in
// DeployNamespace), as the DaemonSet's pods get it, returning its path.
func (s *Server) AgentKubeconfig(t testing.TB, rbacPath string) string {
	t.Helper()
	ApplyRBAC(t, s.Admin, rbacPath, nil)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	s.WriteKubeconfig(t, path, s.Token(t, DeployNamespace, "cellium-agent"))
	return path
}

// StartForAgent starts a kube-apiserver for the agent's cells to run
// against: it skips t when there is no kube-apiserver binary, before
// startEtcd is called (to start an etcd and return its endpoint), and
// returns the server and a kubeconfig of the agent's service account with
// the RBAC manifest at rbacPath applied (AgentKubeconfig).
func StartForAgent(t testing.TB, startEtcd func() string, rbacPath string) (*Server, string) {
	t.Helper()
	if _, err := Binary(); err != nil {
		t.Skip(err)
	}
	s := Start(t, startEtcd())
	return s, s.AgentKubeconfig(t, rbacPath)
}

// CreateDefaultServiceAccount creates the "default" ServiceAccount of the
// "default" namespace, which pods need and which no controller manager
// makes here.
func (s *Server) CreateDefaultServiceAccount(t testing.TB) {
	t.Helper()
	if _, err := s.Admin.CoreV1().ServiceAccounts("default").Create(context.Background(),
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
