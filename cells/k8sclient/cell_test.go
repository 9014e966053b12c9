package k8sclient_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cellium/cellium/cells/daemon"
	"github.com/cellium/cellium/cells/internal/celltest"
	"github.com/cellium/cellium/cells/k8sclient"
)

// newHive is the k8s-client cell with the given command line, and where
// it puts the Clientset once populated.
func newHive(t *testing.T, args ...string) (*hive.Hive, *k8sclient.Clientset) {
	t.Helper()
	var cs k8sclient.Clientset
	h := celltest.New(daemon.Cell, k8sclient.Cell, cell.Invoke(func(c k8sclient.Clientset) { cs = c }))
	run := t.TempDir()
	hive.AddConfigOverride(h, func(c *daemon.Config) {
		c.StateDir, c.RunDir, c.NodeName = filepath.Join(run, "state"), filepath.Join(run, "run"), "node-1"
	})
	flags := pflag.NewFlagSet("", pflag.ContinueOnError)
	h.RegisterFlags(flags)
	if err := flags.Parse(args); err != nil {
		t.Fatal(err)
	}
	return h, &cs
}

// notInPod makes sure auto mode does not find a pod's environment.
func notInPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

// A kubeconfig pointing at a port nothing listens on: constructing the
// client sends nothing.
const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: test
  user: {token: abc}
contexts:
- name: test
  context: {cluster: test, user: test}
current-context: test
`

func TestKubeconfigMode(t *testing.T) {
	notInPod(t)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	h, cs := newHive(t, "--kubeconfig="+path, "--k8s-api-qps=7.5", "--k8s-api-burst=9")
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if (*cs).Embedded() {
		t.Fatal("Embedded() with --kubeconfig, want a real cluster's clientset")
	}
	rest := (*cs).CoreV1().RESTClient()
	if got := rest.Get().URL().Host; got != "127.0.0.1:1" {
		t.Errorf("server %q, want the kubeconfig's 127.0.0.1:1", got)
	}
	if got := rest.GetRateLimiter().QPS(); got != 7.5 {
		t.Errorf("QPS %v, want --k8s-api-qps 7.5", got)
	}
}

// Bad flags fail before anything starts, naming the flag and what would
// be valid.
func TestInvalidFlags(t *testing.T) {
	notInPod(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"kubeconfig that does not exist", []string{"--kubeconfig=/nonexistent/kubeconfig"},
			`invalid --kubeconfig "/nonexistent/kubeconfig": stat /nonexistent/kubeconfig: no such file or directory`},
		{"kubeconfig mode without kubeconfig", []string{"--k8s-mode=kubeconfig"},
			"--k8s-mode=kubeconfig needs --kubeconfig"},
		{"in-cluster outside a pod", []string{"--k8s-mode=in-cluster"},
			"--k8s-mode=in-cluster: unable to load in-cluster configuration"},
		{"unknown mode", []string{"--k8s-mode=cluster"},
			`invalid --k8s-mode "cluster": want auto, in-cluster, kubeconfig or embedded`},
		{"kubeconfig in embedded mode", []string{"--k8s-mode=embedded", "--kubeconfig=/k"},
			`--kubeconfig "/k" conflicts with --k8s-mode=embedded`},
		{"manifests with a kubeconfig", []string{"--kubeconfig=/k", "--k8s-manifests-dir=/m"},
			`--k8s-manifests-dir "/m" is only read in embedded mode, not in kubeconfig mode`},
		{"relative manifests dir", []string{"--k8s-manifests-dir=manifests"},
			`invalid --k8s-manifests-dir "manifests": must be an absolute path`},
		{"zero QPS", []string{"--k8s-api-qps=0"},
			"invalid --k8s-api-qps 0: must be greater than 0"},
		{"zero burst", []string{"--k8s-api-burst=0"},
			"invalid --k8s-api-burst 0: must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newHive(t, tt.args...)
			err := h.Populate(hivetest.Logger(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// In a pod without a service account token auto mode cannot use the
// cluster, and runs embedded.
func TestAutoModeInPodWithoutToken(t *testing.T) {
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Skip("this machine has a service account token")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "1")
	h, cs := newHive(t, "--k8s-manifests-dir="+k8sclient.DefaultManifestsDir)
	if err := h.Populate(hivetest.Logger(t)); err != nil {
		t.Fatal(err)
	}
	if !(*cs).Embedded() {
		t.Fatal("not embedded, want embedded without a token")
	}
}

func TestExplicitManifestsDirMustExist(t *testing.T) {
	notInPod(t)
	dir := filepath.Join(t.TempDir(), "missing")
	h, _ := newHive(t, "--k8s-manifests-dir="+dir)
	err := h.Start(hivetest.Logger(t), context.Background())
	t.Cleanup(func() { h.Stop(hivetest.Logger(t), context.Background()) })
	if err == nil || !strings.Contains(err.Error(), "--k8s-manifests-dir: open "+dir+": no such file or directory") {
		t.Fatalf("start error %v, want one naming --k8s-manifests-dir and %s", err, dir)
	}
}

// Without a cluster and without the default manifests directory the
// embedded API server holds just the agent's own Node.
func TestMissingDefaultManifestsDirIsEmpty(t *testing.T) {
	if _, err := os.Stat(k8sclient.DefaultManifestsDir); err == nil {
		t.Skipf("%s exists on this machine", k8sclient.DefaultManifestsDir)
	}
	notInPod(t)
	h, cs := newHive(t)
	celltest.Start(t, h)
	if !(*cs).Embedded() {
		t.Fatal("not embedded, want embedded without a cluster")
	}
	nodes, err := (*cs).CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 1 || nodes.Items[0].Name != "node-1" {
		t.Fatalf("nodes %v, want the local node-1 only", nodes.Items)
	}
}
