package policy

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/pkg/k8sapi"
	"github.com/cellium/cellium/pkg/labels"
)

// policyWatcher keeps the table "policy-rules" equal to the cluster's
// NetworkPolicies, each translated as it comes.
type policyWatcher struct {
	log     *slog.Logger
	db      *statedb.DB
	rules   statedb.RWTable[*Rule]
	factory *k8sclient.Informers
	synced  cache.DoneChecker
	listed  func(statedb.WriteTxn)
}

func newPolicyWatcher(log *slog.Logger, cs k8sclient.Clientset, db *statedb.DB, rules statedb.RWTable[*Rule]) (*policyWatcher, error) {
	inf := k8sclient.NewInformer(cs, cs.NetworkingV1().NetworkPolicies(metav1.NamespaceAll), &networkingv1.NetworkPolicy{}, nil)
	w := &policyWatcher{log: log, db: db, rules: rules, factory: k8sclient.NewInformers(inf)}
	txn := db.WriteTxn(rules)
	w.listed = rules.RegisterInitializer(txn, "k8s-networkpolicies")
	txn.Commit()
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.upsert,
		UpdateFunc: func(_, obj any) { w.upsert(obj) },
		DeleteFunc: w.delete,
	})
	if err != nil {
		return nil, err
	}
	w.synced = reg.HasSyncedChecker()
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
	w.factory.Start(ctx)
	if !cache.WaitFor(ctx, "", w.synced) {
		return
	}
	txn := w.db.WriteTxn(w.rules)
	w.listed(txn)
	txn.Commit()
	<-ctx.Done()
}

// podPorts watches the pods of the cluster for the named ports of their
// containers, which NetworkPolicy ports may name: those of this node's
// pods for ingress, and every pod's by the label set of its identity for
// egress. The informer keeps of each pod only what that needs (see
// slimPod).
type podPorts struct {
	factory *k8sclient.Informers
	store   cache.Store
	node    string
	synced  cache.DoneChecker
	// labelsOf is a pod's identity label set (cells/identity).
	labelsOf func(idcell.Pod) labels.Labels

	mu sync.Mutex
	// changed are this node's pods that changed since the last take.
	changed map[string]struct{}
	// peersChanged: a pod's named ports, or the identity labels of a pod
	// with named ports, changed since the last take.
	peersChanged bool
	// byKey are the named ports of the pods with named ports, by the
	// identity label set of the pod (identityKey), then by pod; podKey is
	// each such pod's key.
	byKey  map[string]map[string][]namedPort
	podKey map[string]string
	wake   chan struct{}
}

func newPodPorts(cs k8sclient.Clientset, node string, labelsOf func(idcell.Pod) labels.Labels) (*podPorts, error) {
	inf := k8sclient.NewInformer(cs, cs.CoreV1().Pods(metav1.NamespaceAll), &corev1.Pod{}, nil)
	factory := k8sclient.NewInformers(inf)
	if err := inf.SetTransform(slimPod); err != nil {
		return nil, err
	}
	p := &podPorts{factory: factory, store: inf.GetStore(), node: node, labelsOf: labelsOf,
		changed: map[string]struct{}{}, byKey: map[string]map[string][]namedPort{}, podKey: map[string]string{},
		wake: make(chan struct{}, 1)}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.note(obj, false) },
		UpdateFunc: func(_, obj any) { p.note(obj, false) },
		DeleteFunc: func(obj any) { p.note(obj, true) },
	})
	if err != nil {
		return nil, err
	}
	p.synced = reg.HasSyncedChecker()
	return p, nil
}

// slimPod keeps of a pod what the policy cell reads: its name, namespace
// and labels, node, service account and the named ports of its containers
// and sidecars (k8sapi.NamedPortContainers), all as containers.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: pod.Labels,
		ResourceVersion: pod.ResourceVersion, UID: pod.UID},
		Spec: corev1.PodSpec{NodeName: pod.Spec.NodeName, ServiceAccountName: pod.Spec.ServiceAccountName,
			Containers: k8sapi.NamedPortContainers(pod)}}, nil
}

// identityKey is the text of a pod's identity label set without its
// namespace's labels: what identView.portKey is for an identity.
func (p *podPorts) identityKey(pod *corev1.Pod) string {
	return p.labelsOf(idcell.Pod{Namespace: pod.Namespace, Labels: pod.Labels, ServiceAccount: pod.Spec.ServiceAccountName}).String()
}

func (p *podPorts) note(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	name := pod.Namespace + "/" + pod.Name
	var key string
	var ports []namedPort
	if !deleted {
		ports = podNamedPorts(pod)
		if len(ports) > 0 {
			key = p.identityKey(pod)
		}
	}
	p.mu.Lock()
	oldKey, had := p.podKey[name]
	if !had || oldKey != key || !slices.Equal(p.byKey[oldKey][name], ports) {
		if had {
			delete(p.byKey[oldKey], name)
			if len(p.byKey[oldKey]) == 0 {
				delete(p.byKey, oldKey)
			}
			delete(p.podKey, name)
		}
		if len(ports) > 0 {
			if p.byKey[key] == nil {
				p.byKey[key] = map[string][]namedPort{}
			}
			p.byKey[key][name] = ports
			p.podKey[name] = key
		}
		p.peersChanged = p.peersChanged || had || len(ports) > 0
	}
	if pod.Spec.NodeName == p.node {
		p.changed[name] = struct{}{}
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// take is this node's pods that changed since the last take, as
// "namespace/name", and whether any pod's named ports did.
func (p *podPorts) take() ([]string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.changed))
	for k := range p.changed {
		out = append(out, k)
	}
	clear(p.changed)
	peers := p.peersChanged
	p.peersChanged = false
	return out, peers
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
	return podNamedPorts(pod)
}

// peerPorts are the named ports of the pods whose identity label set is
// key; with key "", of every pod.
func (p *podPorts) peerPorts(key string) []namedPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []namedPort
	add := func(pods map[string][]namedPort) {
		for _, ports := range pods {
			for _, np := range ports {
				if !slices.Contains(out, np) {
					out = append(out, np)
				}
			}
		}
	}
	if key != "" {
		add(p.byKey[key])
		return out
	}
	for _, pods := range p.byKey {
		add(pods)
	}
	return out
}

// podNamedPorts are the named ports of a pod the informer slimmed
// (slimPod), its sidecars' included.
func podNamedPorts(pod *corev1.Pod) []namedPort {
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
	p.factory.Start(ctx)
	<-ctx.Done()
}
