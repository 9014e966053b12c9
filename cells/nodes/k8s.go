package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	"github.com/cilium/statedb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/health"
	"github.com/cellium/cellium/cells/k8sclient"
)

// Annotations of Node objects that Cellium writes on its node and reads on
// the others.
const (
	AnnotationPodCIDRs    = "network.cellium.io/pod-cidrs"
	AnnotationHealthIPs   = "network.cellium.io/health-ips"
	AnnotationRoutingMode = "network.cellium.io/routing-mode"
)

// TaintAgentNotReady keeps pods off a node whose agent is not ready yet:
// kubelet registers the node with it (--register-with-taints), the agent
// removes it once ready.
const TaintAgentNotReady = "node.cellium.io/agent-not-ready"

// nodeWatcher follows every Node object: their descriptions are the k8s
// claims, and the local one is what the annotate and mark-ready jobs look
// at.
type nodeWatcher struct {
	log      *slog.Logger
	nodes    *nodes
	factory  *k8sclient.Informers
	informer cache.SharedIndexInformer
	store    cache.Store

	mu sync.Mutex
	// localChanged is closed, and replaced, when the local Node changes.
	localChanged chan struct{}
}

func newNodeWatcher(log *slog.Logger, cs k8sclient.Clientset, n *nodes) *nodeWatcher {
	informer := k8sclient.NewInformer(cs, cs.CoreV1().Nodes(), &corev1.Node{}, nil)
	factory := k8sclient.NewInformers(informer)
	return &nodeWatcher{log: log, nodes: n, factory: factory, informer: informer, store: informer.GetStore(), localChanged: make(chan struct{})}
}

func (w *nodeWatcher) run(ctx context.Context, health cell.Health, synced func(statedb.WriteTxn)) error {
	informer := w.informer
	changed := func(obj any) {
		node, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		w.nodes.claims.set(node.Name, SourceK8s, w.specOf(node), true)
		if node.Name == w.nodes.name {
			w.signal()
		}
	}
	_, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    changed,
		UpdateFunc: func(_, obj any) { changed(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if node, ok := obj.(*corev1.Node); ok {
				w.nodes.claims.set(node.Name, SourceK8s, Spec{}, false)
				if node.Name == w.nodes.name {
					w.signal()
				}
			}
		},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		w.factory.Shutdown()
	}()
	w.factory.Start(ctx)
	// The informer's channel, not WaitForCacheSync's look every 100 ms.
	if !cache.WaitFor(ctx, "", informer.HasSyncedChecker()) {
		return nil
	}
	w.nodes.claims.synced(synced)
	w.signal()
	health.OK(fmt.Sprintf("Watching Node objects (%d)", len(w.store.ListKeys())))
	<-ctx.Done()
	return nil
}

func (w *nodeWatcher) signal() {
	w.mu.Lock()
	close(w.localChanged)
	w.localChanged = make(chan struct{})
	w.mu.Unlock()
}

// local is the local Node object (nil when there is none, or before the
// informer has it), and a channel closed when it changes.
func (w *nodeWatcher) local() (*corev1.Node, <-chan struct{}) {
	w.mu.Lock()
	changed := w.localChanged
	w.mu.Unlock()
	obj, found, err := w.store.GetByKey(w.nodes.name)
	if err != nil || !found {
		return nil, changed
	}
	node, _ := obj.(*corev1.Node)
	return node, changed
}

// specOf is what a Node object says of its node: its InternalIP and
// ExternalIP addresses, spec.podCIDRs (or, when the controller manager
// assigns none, the pod CIDRs its agent annotated) and its health IPs.
// Values that do not parse are left out, logged with the Node's name.
func (w *nodeWatcher) specOf(node *corev1.Node) Spec {
	var s Spec
	bad := func(field, value string) {
		w.log.Warn("Ignoring an invalid value of a Node", "node", node.Name, "field", field, "value", value)
	}
	for _, a := range node.Status.Addresses {
		typ := AddressType(a.Type)
		if typ != InternalIP && typ != ExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			bad("status.addresses", a.Address)
			continue
		}
		s.Addresses = append(s.Addresses, Address{Type: typ, IP: ip})
	}
	cidrs, field := node.Spec.PodCIDRs, "spec.podCIDRs"
	if len(cidrs) == 0 && node.Annotations[AnnotationPodCIDRs] != "" {
		cidrs, field = strings.Split(node.Annotations[AnnotationPodCIDRs], ","), "annotation "+AnnotationPodCIDRs
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil || p != p.Masked() {
			bad(field, c)
			continue
		}
		s.PodCIDRs = append(s.PodCIDRs, p)
	}
	if v := node.Annotations[AnnotationHealthIPs]; v != "" {
		for _, h := range strings.Split(v, ",") {
			ip, err := netip.ParseAddr(strings.TrimSpace(h))
			if err != nil {
				bad("annotation "+AnnotationHealthIPs, h)
				continue
			}
			s.HealthIPs = append(s.HealthIPs, ip)
		}
	}
	return s
}

// annotate writes this node's pod CIDRs, health IPs and the annotations
// other cells contribute onto its Node object, when they differ from what
// it has: at start, and whenever the local node or the Node changes.
func annotate(ctx context.Context, health cell.Health, log *slog.Logger, cs k8sclient.Clientset, w *nodeWatcher, n *nodes, extra []Annotation) error {
	for {
		txn := n.db.ReadTxn()
		local, _, localWatch, found := n.tbl.GetWatch(txn, ByName.Query(n.name))
		obj, objChanged := w.local()
		switch {
		case !found || !local.Local:
			health.OK("Waiting for this node's description")
		case obj == nil:
			health.OK(fmt.Sprintf("No Node %s to annotate", n.name))
		default:
			want := map[string]string{
				AnnotationPodCIDRs:  joinStrings(local.PodCIDRs),
				AnnotationHealthIPs: joinStrings(local.HealthIPs),
			}
			for _, a := range extra {
				want[a.Key] = a.Value
			}
			patch := map[string]any{}
			for _, k := range slices.Sorted(maps.Keys(want)) {
				have, ok := obj.Annotations[k]
				switch {
				case want[k] == "" && ok:
					patch[k] = nil
				case want[k] != "" && have != want[k]:
					patch[k] = want[k]
				}
			}
			if len(patch) > 0 {
				data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
				if _, err := cs.CoreV1().Nodes().Patch(ctx, n.name, types.MergePatchType, data, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("annotate Node %s: %w", n.name, err)
				}
				log.Info("Annotated this node's Node object", "node", n.name, "annotations", patch)
			}
			health.OK(fmt.Sprintf("Node %s annotated", n.name))
		}
		select {
		case <-localWatch:
		case <-objChanged:
		case <-ctx.Done():
			return nil
		}
	}
}

// Node condition this agent sets once ready.
const (
	conditionReason  = "CelliumIsUp"
	conditionMessage = "Cellium is running on this node"
)

// markReady, once the agent is ready, sets the Node condition
// NetworkUnavailable=False and removes the taint TaintAgentNotReady, and
// again whenever the Node loses them while the agent is ready (a node
// that registers again, say).
func markReady(ctx context.Context, health cell.Health, log *slog.Logger, cs k8sclient.Clientset, w *nodeWatcher, name string, readiness *health.Readiness) error {
	for {
		hz, readyChanged := readiness.Status()
		obj, objChanged := w.local()
		switch {
		case !hz.Ready:
			health.OK("Waiting for the agent to be ready")
		case obj == nil:
			health.OK(fmt.Sprintf("No Node %s to mark ready", name))
		default:
			if !networkAvailable(obj) {
				now := metav1.NewTime(time.Now())
				cond := corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse,
					Reason: conditionReason, Message: conditionMessage, LastTransitionTime: now, LastHeartbeatTime: now}
				data, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
				if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status"); err != nil {
					return fmt.Errorf("set NetworkUnavailable=False on Node %s: %w", name, err)
				}
				log.Info("Node condition NetworkUnavailable=False", "node", name, "reason", conditionReason)
			}
			if i := slices.IndexFunc(obj.Spec.Taints, isAgentNotReady); i >= 0 {
				// test-and-replace: a taint list changed meanwhile makes the
				// patch fail and the job retry with the new list.
				data, _ := json.Marshal([]map[string]any{
					{"op": "test", "path": "/spec/taints", "value": obj.Spec.Taints},
					{"op": "replace", "path": "/spec/taints", "value": slices.DeleteFunc(slices.Clone(obj.Spec.Taints), isAgentNotReady)},
				})
				if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.JSONPatchType, data, metav1.PatchOptions{}); err != nil {
					return fmt.Errorf("remove taint %s from Node %s: %w", TaintAgentNotReady, name, err)
				}
				log.Info("Removed the not-ready taint", "node", name, "taint", TaintAgentNotReady)
			}
			health.OK(fmt.Sprintf("Node %s marked ready", name))
		}
		select {
		case <-readyChanged:
		case <-objChanged:
		case <-ctx.Done():
			return nil
		}
	}
}

func isAgentNotReady(t corev1.Taint) bool { return t.Key == TaintAgentNotReady }

func networkAvailable(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			return c.Status == corev1.ConditionFalse && c.Reason == conditionReason
		}
	}
	return false
}
