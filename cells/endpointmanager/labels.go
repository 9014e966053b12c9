package endpointmanager

import (
	"context"
	"log/slog"
	"maps"
	"sync"

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
	// uid is the pod's UID (not part of the identity).
	uid             string
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
	// waitPods says an ADD naming a pod the store does not have waits
	// for it: with a real API server (not embedded, where a pod no
	// manifest holds never comes).
	waitPods bool
	// changedMu guards changed, closed and replaced after each pod or
	// namespace event of the informers, once the store has it.
	changedMu sync.Mutex
	changed   chan struct{}
}

func newPodWatcher(cs k8sclient.Clientset, node string, m *Manager) (*podWatcher, error) {
	podInformer := k8sclient.NewInformer(cs, cs.CoreV1().Pods(metav1.NamespaceAll), &corev1.Pod{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	})
	nsInformer := k8sclient.NewInformer(cs, cs.CoreV1().Namespaces(), &corev1.Namespace{}, nil)
	w := &podWatcher{log: m.log, node: node, pods: k8sclient.NewInformers(podInformer), namespaces: k8sclient.NewInformers(nsInformer),
		podStore: podInformer.GetStore(), nsStore: nsInformer.GetStore(), podSynced: podInformer.HasSynced, nsSynced: nsInformer.HasSynced,
		listed: make(chan struct{}), waitPods: !cs.Embedded(), changed: make(chan struct{})}
	podChanged := func(obj any) {
		w.notify()
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
		w.notify()
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
	meta := podMeta{uid: string(pod.UID), labels: pod.Labels, serviceAccount: pod.Spec.ServiceAccountName}
	if obj, found, err := w.nsStore.GetByKey(namespace); err == nil && found {
		if ns, ok := obj.(*corev1.Namespace); ok {
			meta.namespaceLabels = ns.Labels
		}
	}
	return meta, true
}

// notify wakes those waiting for a pod or namespace (waitPod).
func (w *podWatcher) notify() {
	w.changedMu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.changedMu.Unlock()
}

// watch is closed at the next pod or namespace event.
func (w *podWatcher) watch() <-chan struct{} {
	w.changedMu.Lock()
	defer w.changedMu.Unlock()
	return w.changed
}

// waitPod waits, as long as ctx allows, until the store has the pod
// namespace/name of this node, of UID uid unless uid is "", and its
// namespace: an ADD may come before
// the watch has brought the pod (the kubelet asks for the network of a pod
// the API server bound a moment ago), and without its labels the endpoint
// would have the identity, and so the policy, of a pod no NetworkPolicy
// selects. The UID tells a pod deleted and made again under the same name
// (a StatefulSet's, possibly with other labels) from the one the store may
// still have until the watch brings the deletion. In embedded mode it waits for nothing: pods come from the
// manifests, and a pod that none holds gets its network without labels.
func (w *podWatcher) waitPod(ctx context.Context, namespace, name, uid string) error {
	if !w.waitPods {
		return nil
	}
	for {
		watch := w.watch()
		if meta, ok := w.lookup(namespace, name); ok && (uid == "" || meta.uid == uid) && w.hasNamespace(namespace) {
			return nil
		}
		select {
		case <-watch:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// hasNamespace says whether the store has the namespace.
func (w *podWatcher) hasNamespace(namespace string) bool {
	_, found, err := w.nsStore.GetByKey(namespace)
	return err == nil && found
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
