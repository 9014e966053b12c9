package policy

import (
	"context"
	"log/slog"
	"sync"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/k8sclient"
)

// policyWatcher keeps the table "policy-rules" equal to the cluster's
// NetworkPolicies, each translated as it comes.
type policyWatcher struct {
	log     *slog.Logger
	db      *statedb.DB
	rules   statedb.RWTable[*Rule]
	factory informers.SharedInformerFactory
	synced  cache.InformerSynced
	listed  func(statedb.WriteTxn)
}

func newPolicyWatcher(log *slog.Logger, cs k8sclient.Clientset, db *statedb.DB, rules statedb.RWTable[*Rule]) (*policyWatcher, error) {
	w := &policyWatcher{log: log, db: db, rules: rules, factory: informers.NewSharedInformerFactory(cs, 0)}
	txn := db.WriteTxn(rules)
	w.listed = rules.RegisterInitializer(txn, "k8s-networkpolicies")
	txn.Commit()
	reg, err := w.factory.Networking().V1().NetworkPolicies().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.upsert,
		UpdateFunc: func(_, obj any) { w.upsert(obj) },
		DeleteFunc: w.delete,
	})
	if err != nil {
		return nil, err
	}
	w.synced = reg.HasSynced
	return w, nil
}

func (w *policyWatcher) upsert(obj any) {
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return
	}
	r := Translate(np)
	txn := w.db.WriteTxn(w.rules)
	defer txn.Abort()
	if _, _, err := w.rules.Insert(txn, r); err != nil {
		w.log.Error("Write the NetworkPolicy", "policy", r.Name, "error", err)
		return
	}
	txn.Commit()
}

func (w *policyWatcher) delete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return
	}
	txn := w.db.WriteTxn(w.rules)
	defer txn.Abort()
	if _, _, err := w.rules.Delete(txn, &Rule{Name: np.Namespace + "/" + np.Name}); err != nil {
		w.log.Error("Delete the NetworkPolicy", "policy", np.Namespace+"/"+np.Name, "error", err)
		return
	}
	txn.Commit()
}

func (w *policyWatcher) run(ctx context.Context) {
	defer w.factory.Shutdown()
	w.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), w.synced) {
		return
	}
	txn := w.db.WriteTxn(w.rules)
	w.listed(txn)
	txn.Commit()
	<-ctx.Done()
}

// podPorts watches the pods of this node for the named ports of their
// containers, which NetworkPolicy ports may name.
type podPorts struct {
	factory informers.SharedInformerFactory
	store   cache.Store
	node    string
	synced  cache.InformerSynced

	mu      sync.Mutex
	changed map[string]struct{}
	wake    chan struct{}
}

func newPodPorts(cs k8sclient.Clientset, node string) (*podPorts, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	inf := factory.Core().V1().Pods().Informer()
	p := &podPorts{factory: factory, store: inf.GetStore(), node: node, changed: map[string]struct{}{}, wake: make(chan struct{}, 1)}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    p.note,
		UpdateFunc: func(_, obj any) { p.note(obj) },
		DeleteFunc: p.note,
	})
	if err != nil {
		return nil, err
	}
	p.synced = reg.HasSynced
	return p, nil
}

func (p *podPorts) note(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	// The embedded API server ignores field selectors in watches.
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != p.node {
		return
	}
	p.mu.Lock()
	p.changed[pod.Namespace+"/"+pod.Name] = struct{}{}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take is the pods that changed since the last take, as "namespace/name".
func (p *podPorts) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.changed))
	for k := range p.changed {
		out = append(out, k)
	}
	clear(p.changed)
	return out
}

// ports are the named ports of a pod's containers.
func (p *podPorts) ports(namespace, name string) []namedPort {
	obj, found, err := p.store.GetByKey(namespace + "/" + name)
	if err != nil || !found {
		return nil
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil
	}
	var out []namedPort
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == "" || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
				continue
			}
			proto := ProtoTCP
			switch cp.Protocol {
			case corev1.ProtocolUDP:
				proto = ProtoUDP
			case corev1.ProtocolSCTP:
				proto = ProtoSCTP
			}
			out = append(out, namedPort{name: cp.Name, protocol: proto, port: uint16(cp.ContainerPort)})
		}
	}
	return out
}

func (p *podPorts) run(ctx context.Context) {
	defer p.factory.Shutdown()
	p.factory.Start(ctx.Done())
	<-ctx.Done()
}
