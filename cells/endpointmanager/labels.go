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

// setLabels gives the endpoint of a pod its labels, on disk and in the
// table; the endpoint map does not hold labels, so its status stays.
func (m *Manager) setLabels(namespace, name string, labels map[string]string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	txn := m.db.WriteTxn(m.tbl)
	defer txn.Abort()
	for ep := range m.tbl.List(txn, EndpointPod.Query(namespace+"/"+name)) {
		if maps.Equal(ep.Labels, labels) {
			continue
		}
		ep = ep.Clone()
		ep.Labels = maps.Clone(labels)
		if err := m.states.write(ep, phaseReady); err != nil {
			m.log.Error("Write the endpoint's new pod labels", "id", ep.ID, "pod", namespace+"/"+name, "error", err)
			continue
		}
		if _, _, err := m.tbl.Insert(txn, ep); err != nil {
			m.log.Error("Update the endpoint's pod labels", "id", ep.ID, "error", err)
			return
		}
		m.log.Debug("Endpoint has new pod labels", "id", ep.ID, "pod", namespace+"/"+name, "labels", labels)
	}
	txn.Commit()
}
