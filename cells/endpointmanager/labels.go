package endpointmanager

import (
	"context"
	"log/slog"
	"maps"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/identity"
)

// podLabels keeps endpoints' labels equal to their Pods' labels in the API
// server: the pods of this node, by namespace and name.
type podLabels struct {
	log     *slog.Logger
	node    string
	factory informers.SharedInformerFactory
	store   cache.Store
}

func newPodLabels(cs k8sclient.Clientset, node string, m *Manager) (*podLabels, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	informer := factory.Core().V1().Pods().Informer()
	p := &podLabels{log: m.log, node: node, factory: factory, store: informer.GetStore()}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.changed(m, obj) },
		UpdateFunc: func(_, obj any) { p.changed(m, obj) },
	})
	return p, err
}

// changed applies a pod's labels to its endpoint.
func (p *podLabels) changed(m *Manager, obj any) {
	pod, ok := obj.(*corev1.Pod)
	// The embedded API server ignores field selectors in watches.
	if !ok || pod.Spec.NodeName != p.node {
		return
	}
	m.setLabels(pod.Namespace, pod.Name, pod.Labels)
}

// lookup is the labels of a pod of this node, when the informer has it.
func (p *podLabels) lookup(namespace, name string) map[string]string {
	obj, found, err := p.store.GetByKey(namespace + "/" + name)
	if err != nil || !found {
		return nil
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != p.node {
		return nil
	}
	return maps.Clone(pod.Labels)
}

// run watches the pods until the agent stops.
func (p *podLabels) run(ctx context.Context, health cell.Health) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		p.factory.Shutdown()
	}()
	p.factory.Start(ctx.Done())
	p.factory.WaitForCacheSync(ctx.Done())
	if ctx.Err() == nil {
		p.log.Info("Watching the pods of this node for their labels", "node", p.node, "pods", len(p.store.ListKeys()))
		health.OK("Watching the pods of node " + p.node)
	}
	<-ctx.Done()
	return nil
}

// setLabels gives the endpoint of a pod its labels, and the identity of
// its new label set, on disk and in the table. The datapath keeps the
// endpoint's connections: only the identity it is known by changes.
func (m *Manager) setLabels(namespace, name string, labels map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ep := range m.tbl.List(m.db.ReadTxn(), EndpointPod.Query(namespace+"/"+name)) {
		if maps.Equal(ep.Labels, labels) {
			continue
		}
		old := ep
		ep = ep.Clone()
		ep.Labels = maps.Clone(labels)
		ep.Identity, ep.IdentityPending = m.acquireIdentity(context.Background(), ep, identity.Unknown)
		if err := m.update(ep); err != nil {
			m.log.Error("Write the endpoint's new pod labels", "id", ep.ID, "pod", namespace+"/"+name, "error", err)
			m.releaseIdentity(ep)
			continue
		}
		m.releaseIdentity(old)
		m.log.Info("Endpoint has new pod labels", "id", ep.ID, "pod", namespace+"/"+name, "identity", ep.Identity, "was", old.Identity)
	}
}
