package endpointmanager

import (
	"context"
	"log/slog"
	"maps"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/k8sclient"
)

// podMeta is what the endpoint of a pod learns from the API server: what
// its identity is made of.
type podMeta struct {
	labels          map[string]string
	serviceAccount  string
	namespaceLabels map[string]string
}

// apply sets an endpoint's fields from m.
func (m podMeta) apply(ep *Endpoint) {
	ep.Labels, ep.ServiceAccount, ep.NamespaceLabels = maps.Clone(m.labels), m.serviceAccount, maps.Clone(m.namespaceLabels)
}

// podWatcher keeps endpoints' pod metadata equal to what the API server
// has: the pods of this node, and every namespace (for its labels).
type podWatcher struct {
	log        *slog.Logger
	node       string
	pods       *k8sclient.Informers
	namespaces *k8sclient.Informers
	podStore   cache.Store
	nsStore    cache.Store
	podSynced  cache.InformerSynced
	nsSynced   cache.InformerSynced
	// listed is closed once both informers have listed.
	listed chan struct{}
}

func newPodWatcher(cs k8sclient.Clientset, node string, m *Manager) (*podWatcher, error) {
	podInformer := k8sclient.NewInformer(cs, cs.CoreV1().Pods(metav1.NamespaceAll), &corev1.Pod{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	})
	nsInformer := k8sclient.NewInformer(cs, cs.CoreV1().Namespaces(), &corev1.Namespace{}, nil)
	w := &podWatcher{log: m.log, node: node, pods: k8sclient.NewInformers(podInformer), namespaces: k8sclient.NewInformers(nsInformer),
		podStore: podInformer.GetStore(), nsStore: nsInformer.GetStore(), podSynced: podInformer.HasSynced, nsSynced: nsInformer.HasSynced,
		listed: make(chan struct{})}
	podChanged := func(obj any) {
		// The embedded API server ignores field selectors in watches.
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName == node {
			m.podChanged(pod.Namespace, pod.Name)
		}
	}
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    podChanged,
		UpdateFunc: func(_, obj any) { podChanged(obj) },
	}); err != nil {
		return nil, err
	}
	nsChanged := func(obj any) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			m.namespaceChanged(ns.Name)
		}
	}
	_, err := nsInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    nsChanged,
		UpdateFunc: func(_, obj any) { nsChanged(obj) },
	})
	return w, err
}

// lookup is what the API server says of a pod of this node, when the
// informer has it.
func (w *podWatcher) lookup(namespace, name string) (podMeta, bool) {
	obj, found, err := w.podStore.GetByKey(namespace + "/" + name)
	if err != nil || !found {
		return podMeta{}, false
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != w.node {
		return podMeta{}, false
	}
	meta := podMeta{labels: pod.Labels, serviceAccount: pod.Spec.ServiceAccountName}
	if obj, found, err := w.nsStore.GetByKey(namespace); err == nil && found {
		if ns, ok := obj.(*corev1.Namespace); ok {
			meta.namespaceLabels = ns.Labels
		}
	}
	return meta, true
}

// waitListed waits until the pods of this node and the namespaces are
// listed, as long as ctx allows. Before, a pod's labels may be missing: its
// endpoint would get the identity of none, and so the policy of a pod that
// no NetworkPolicy selects (everything allowed), and its ADD would be
// answered with that policy in the maps, its own coming only later.
func (w *podWatcher) waitListed(ctx context.Context) error {
	select {
	case <-w.listed:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// run watches pods and namespaces until the agent stops.
func (w *podWatcher) run(ctx context.Context, health cell.Health) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		w.pods.Shutdown()
		w.namespaces.Shutdown()
	}()
	w.pods.Start(ctx)
	w.namespaces.Start(ctx)
	cache.WaitForCacheSync(ctx.Done(), w.podSynced, w.nsSynced)
	if ctx.Err() == nil {
		w.log.Info("Watching the pods of this node and the namespaces for their labels", "node", w.node,
			"pods", len(w.podStore.ListKeys()), "namespaces", len(w.nsStore.ListKeys()))
		close(w.listed)
		health.OK("Watching the pods of node " + w.node + " and the namespaces")
	}
	<-ctx.Done()
	return nil
}
