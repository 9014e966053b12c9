package devcluster

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/cellium/cellium/deploy"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/kubeapiserver"
	"github.com/cellium/cellium/pkg/netnsrun"
)

// Identity allocation modes of a cluster (Options.IdentityMode): where its
// agents keep cluster-wide identities, and so what the cluster runs for
// them.
const (
	// IdentityKVStore: the agents share etcd (--kvstore=etcd) and serve
	// the manifests directory from an embedded API server each.
	IdentityKVStore = "kvstore"
	// IdentityCRD: the agents share a real kube-apiserver (on the
	// cluster's etcd, which they do not use themselves), with the
	// DaemonSet's RBAC, and keep identities and endpoints in it as
	// CelliumIdentity and CelliumEndpoint objects.
	IdentityCRD = "crd"
)

// KubeAPIPort is the port of the cluster's kube-apiserver (crd mode), on
// the bridge's address.
const KubeAPIPort = 6443

// AgentServiceAccount is the user the agents authenticate as in crd mode:
// deploy/rbac.yaml's ServiceAccount, as the DaemonSet's pods are.
const AgentServiceAccount = "system:serviceaccount:kube-system:cellium-agent"

// fieldManager owns the fields the cluster applies.
const fieldManager = "agent-dev-cluster"

func (s *state) crd() bool       { return s.IdentityMode == IdentityCRD }
func (s *state) kubeDir() string { return filepath.Join(s.Dir, "kube-apiserver") }
func (s *state) kubeLog() string { return filepath.Join(s.Dir, "kube-apiserver.log") }
func (s *state) kubeAPIURL() string {
	return "https://" + netip.AddrPortFrom(s.Gateway4, KubeAPIPort).String()
}
func (s *state) adminKubeconfig() string { return filepath.Join(s.kubeDir(), "admin.kubeconfig") }
func (s *state) agentKubeconfig() string { return filepath.Join(s.kubeDir(), "agent.kubeconfig") }

func (s *state) kubeSetup() kubeapiserver.Setup {
	return kubeapiserver.Setup{
		Binary: s.KubeAPIServerBinary, EtcdServers: s.etcdURL(), EtcdPrefix: "/registry",
		Address: s.Gateway4.String(), Port: strconv.Itoa(KubeAPIPort), Dir: s.kubeDir(),
		ServiceCIDR: "10.96.0.0/16",
	}
}

// AdminKubeconfig is the kubeconfig of the cluster's administrator (crd
// mode), for kubectl in the bridge namespace; "" without a kube-apiserver.
func (c *Cluster) AdminKubeconfig() string {
	s := c.snapshot()
	if !s.crd() {
		return ""
	}
	return s.adminKubeconfig()
}

// KubeRESTConfig is a client configuration of the cluster's administrator
// (crd mode), dialling from the bridge namespace; an error without a
// kube-apiserver.
func (c *Cluster) KubeRESTConfig() (*rest.Config, error) {
	s := c.snapshot()
	if !s.crd() {
		return nil, fmt.Errorf("cluster %s runs no kube-apiserver: its identity allocation mode is %s, not crd", s.Name, IdentityKVStore)
	}
	return s.kubeRESTConfig()
}

// startKubeAPI starts kube-apiserver in the bridge namespace on the
// cluster's etcd, waits until it is ready, applies deploy/rbac.yaml and
// writes the kubeconfigs of the administrator and of the agents (the
// ServiceAccount of rbac.yaml).
func (c *Cluster) startKubeAPI(ctx context.Context, s *state) error {
	setup := s.kubeSetup()
	admin, agent := randomToken(), randomToken()
	err := setup.WriteFiles(
		kubeapiserver.Token{Token: admin, User: "admin", Groups: []string{"system:masters"}},
		kubeapiserver.Token{Token: agent, User: AgentServiceAccount, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system"}},
	)
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	for path, token := range map[string]string{s.adminKubeconfig(): admin, s.agentKubeconfig(): agent} {
		if err := writeKubeconfig(path, s.kubeAPIURL(), setup.CA(), token); err != nil {
			return err
		}
	}
	p, err := startDetached(s.BridgeNetNS, setup.Args(), s.kubeLog(), c.stopWithCaller)
	if err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	s.KubeAPI = p
	if err := s.save(); err != nil {
		return err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	for !kubeAPIReady(wctx, s) {
		if !p.Alive() {
			return fmt.Errorf("kube-apiserver exited at start; the end of its log %s:\n%s", s.kubeLog(), tail(s.kubeLog(), 20))
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("kube-apiserver is not ready after %s; the end of its log %s:\n%s", time.Since(start).Round(time.Second), s.kubeLog(), tail(s.kubeLog(), 20))
		case <-time.After(100 * time.Millisecond):
		}
	}
	c.log.Info("Started kube-apiserver", "pid", p.PID, "url", s.kubeAPIURL(), "duration", time.Since(start).Round(time.Millisecond))
	kc, err := s.kubeClient()
	if err != nil {
		return err
	}
	if err := kc.applyYAML(ctx, "deploy/rbac.yaml", deploy.RBAC, "kube-system"); err != nil {
		return err
	}
	// No controller manager makes a namespace's default ServiceAccount,
	// which admission wants of every pod.
	return kc.ensureNamespace(ctx, DefaultNamespace)
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func writeKubeconfig(path, server, ca, token string) error {
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: dev-cluster
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: dev-cluster
  user:
    token: %s
contexts:
- name: dev-cluster
  context: {cluster: dev-cluster, user: dev-cluster}
current-context: dev-cluster
`, server, ca, token)
	return os.WriteFile(path, []byte(kubeconfig), 0o600)
}

// kubeRESTConfig is the administrator's client configuration, dialling
// from the bridge namespace.
func (s *state) kubeRESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.adminKubeconfig())
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver: %w", err)
	}
	ns := s.BridgeNetNS
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return dialIn(ctx, ns, network, addr)
	}
	cfg.Timeout = 30 * time.Second
	return cfg, nil
}

// kubeAPIReady asks kube-apiserver's /readyz from the bridge namespace.
func kubeAPIReady(ctx context.Context, s *state) bool {
	if _, err := os.Stat(s.kubeSetup().CA()); err != nil || !netnsrun.Exists(s.BridgeNetNS) {
		return false
	}
	cfg, err := s.kubeRESTConfig()
	if err != nil {
		return false
	}
	tr, err := rest.TransportFor(cfg)
	if err != nil {
		return false
	}
	return answersOK(ctx, tr, s.kubeAPIURL()+"/readyz", 2*time.Second)
}

// kubeClient applies and deletes objects of any kind the server knows.
type kubeClient struct {
	dyn dynamic.Interface
	// discover reads the server's discovery document of a group
	// version (/api/v1, /apis/GROUP/VERSION).
	discover func(ctx context.Context, path string) ([]byte, error)
}

func (s *state) kubeClient() (*kubeClient, error) {
	cfg, err := s.kubeRESTConfig()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// Not client-go's discovery client: its package imports client-go's
	// scheme of every API group (pkg/kubeclient), which this needs none of.
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	discover := func(ctx context.Context, path string) ([]byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+path, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Accept", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
		}
		return body, nil
	}
	return &kubeClient{dyn: dyn, discover: discover}, nil
}

// mapping is the resource of kind gvk and whether it is namespaced, from
// the server's discovery document of its group version (read on each
// call: a dev cluster applies a handful of objects, and a kind whose CRD
// was just created must be found).
func (k *kubeClient) mapping(ctx context.Context, gvk schema.GroupVersionKind) (schema.GroupVersionResource, bool, error) {
	path := "/apis/" + gvk.Group + "/" + gvk.Version
	if gvk.Group == "" {
		path = "/api/" + gvk.Version
	}
	data, err := k.discover(ctx, path)
	if err != nil {
		return schema.GroupVersionResource{}, false, err
	}
	var list metav1.APIResourceList
	if err := json.Unmarshal(data, &list); err != nil {
		return schema.GroupVersionResource{}, false, fmt.Errorf("GET %s: %w", path, err)
	}
	for _, r := range list.APIResources {
		if r.Kind == gvk.Kind && !strings.Contains(r.Name, "/") {
			return gvk.GroupVersion().WithResource(r.Name), r.Namespaced, nil
		}
	}
	return schema.GroupVersionResource{}, false, fmt.Errorf("the API server serves no kind %s in %s", gvk.Kind, gvk.GroupVersion())
}

// resource is the client of obj's kind, in its namespace (defaultNS when
// it names none) if the kind is namespaced.
func (k *kubeClient) resource(ctx context.Context, obj *unstructured.Unstructured, defaultNS string) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	gvr, namespaced, err := k.mapping(ctx, gvk)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	if !namespaced {
		return k.dyn.Resource(gvr), nil
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(defaultNS)
	}
	return k.dyn.Resource(gvr).Namespace(obj.GetNamespace()), nil
}

// apply applies obj (server-side apply, as manager), and then its status,
// which the main resource ignores, if it has one: with a merge patch, as
// server-side apply refuses lists that repeat a key (a Node's two
// InternalIP addresses).
func (k *kubeClient) apply(ctx context.Context, obj *unstructured.Unstructured, defaultNS, manager string) error {
	ri, err := k.resource(ctx, obj, defaultNS)
	if err != nil {
		return err
	}
	main := obj.DeepCopy()
	status, hasStatus := main.Object["status"]
	delete(main.Object, "status")
	if _, err := ri.Apply(ctx, obj.GetName(), main, metav1.ApplyOptions{FieldManager: manager, Force: true}); err != nil {
		return fmt.Errorf("apply %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	if hasStatus {
		patch, err := json.Marshal(object{"status": status})
		if err != nil {
			return err
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: manager}, "status"); err != nil {
			return fmt.Errorf("patch the status of %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return nil
}

// delete deletes obj at once (no grace: no kubelet confirms a pod's end);
// one that is gone already is no error.
func (k *kubeClient) delete(ctx context.Context, obj *unstructured.Unstructured) error {
	ri, err := k.resource(ctx, obj, DefaultNamespace)
	if err != nil {
		return err
	}
	now := int64(0)
	err = ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{GracePeriodSeconds: &now})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

// ensureNamespace makes namespace ns and its default ServiceAccount if
// missing, owning none of the fields a manifest of them sets.
func (k *kubeClient) ensureNamespace(ctx context.Context, ns string) error {
	for _, obj := range []object{
		{"apiVersion": "v1", "kind": "Namespace", "metadata": object{"name": ns}},
		{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object{"name": "default", "namespace": ns}},
	} {
		if err := k.apply(ctx, &unstructured.Unstructured{Object: obj}, ns, fieldManager+"-namespaces"); err != nil {
			return err
		}
	}
	return nil
}

// decodeYAML is the objects of YAML documents (or one JSON document);
// what is not an object with a kind is an error naming the document and
// where it came from.
func decodeYAML(from string, data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for i, doc := range bytes.Split(data, []byte("\n---")) {
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", from, i+1, err)
		}
		if len(m) == 0 {
			continue
		}
		obj := &unstructured.Unstructured{Object: m}
		if obj.GetKind() == "" || obj.GetAPIVersion() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("%s document %d: not a Kubernetes object (want apiVersion, kind and metadata.name)", from, i+1)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// applyYAML applies the objects of YAML documents; from names them in
// errors.
func (k *kubeClient) applyYAML(ctx context.Context, from string, data []byte, defaultNS string) error {
	objs, err := decodeYAML(from, data)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := k.apply(ctx, obj, defaultNS, fieldManager); err != nil {
			return fmt.Errorf("%s: %w", from, err)
		}
	}
	return nil
}

// kubeApply applies a manifest's objects to the cluster's kube-apiserver
// (crd mode; without one it does nothing): a pod's namespace and its
// default ServiceAccount first.
func (s *state) kubeApply(from string, data []byte) error {
	return s.kubeObjects(from, data, func(ctx context.Context, k *kubeClient, obj *unstructured.Unstructured) error {
		if obj.GetKind() == "Pod" && obj.GetAPIVersion() == "v1" {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = DefaultNamespace
			}
			if err := k.ensureNamespace(ctx, ns); err != nil {
				return err
			}
		}
		return k.apply(ctx, obj, DefaultNamespace, fieldManager)
	}, false)
}

// kubeDelete deletes a manifest's objects from the cluster's
// kube-apiserver (crd mode; without one it does nothing).
func (s *state) kubeDelete(from string, data []byte) error {
	return s.kubeObjects(from, data, func(ctx context.Context, k *kubeClient, obj *unstructured.Unstructured) error {
		return k.delete(ctx, obj)
	}, true)
}

// kubeObjects does do to each object of a manifest, in crd mode (else
// nothing), within a minute: stopping at the first error, or with all
// going on past one and every error returned.
func (s *state) kubeObjects(from string, data []byte, do func(context.Context, *kubeClient, *unstructured.Unstructured) error, all bool) error {
	if !s.crd() {
		return nil
	}
	objs, err := decodeYAML(from, data)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := s.kubeClient()
	if err != nil {
		return err
	}
	var errs []error
	for _, obj := range objs {
		if err := do(ctx, k, obj); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", from, err))
			if !all {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// kubeDeleteNodeEndpoints deletes the CelliumEndpoint objects of node.
func (s *state) kubeDeleteNodeEndpoints(node string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := s.kubeClient()
	if err != nil {
		return err
	}
	eps := k.dyn.Resource(k8sapi.GroupVersion.WithResource(k8sapi.ResourceEndpoints))
	list, err := eps.List(ctx, metav1.ListOptions{LabelSelector: k8sapi.LabelNode + "=" + node})
	if apierrors.IsNotFound(err) {
		// No CRD: no objects.
		return nil
	}
	if err != nil {
		return fmt.Errorf("list the CelliumEndpoint objects of node %s: %w", node, err)
	}
	var errs []error
	for _, obj := range list.Items {
		err := eps.Namespace(obj.GetNamespace()).Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete CelliumEndpoint %s/%s: %w", obj.GetNamespace(), obj.GetName(), err))
		}
	}
	return errors.Join(errs...)
}
