package k8sendpoints

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/hive/cell"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/cellium/cellium/cells/endpointmanager"
	"github.com/cellium/cellium/cells/internal/tables"
	"github.com/cellium/cellium/cells/k8sclient"
	"github.com/cellium/cellium/cells/nodes"
	"github.com/cellium/cellium/pkg/backoff"
	"github.com/cellium/cellium/pkg/k8sapi"
)

// writer keeps this node's CelliumEndpoint objects equal to its pods'
// endpoints: one object per pod with a resolved identity, written only
// when it differs from what the API server has (so a pod's start costs one
// create), deleted when its endpoint is gone (also at start, for the
// objects of pods that went while the agent was down) and checked again
// every --endpoint-objects-resync.
type writer struct {
	s *syncer

	mu sync.Mutex
	// own are this node's objects as the API server has them: from the
	// watch, and from this writer's own writes until the watch catches up.
	own    map[string]*k8sapi.CelliumEndpoint
	synced chan struct{}
	wake   chan struct{}
}

func newWriter(s *syncer) *writer {
	return &writer{s: s, own: map[string]*k8sapi.CelliumEndpoint{}, synced: make(chan struct{}), wake: make(chan struct{}, 1)}
}

// listed says the watch has listed every object.
func (w *writer) listed() { close(w.synced) }

func (w *writer) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// rv is a resource version as a number, 0 when it is not one.
func rv(o *k8sapi.CelliumEndpoint) uint64 {
	n, _ := strconv.ParseUint(o.ResourceVersion, 10, 64)
	return n
}

// supersedes says whether ep replaces have in own: there is none, it is
// another object (UID), or ep is not older.
func supersedes(ep, have *k8sapi.CelliumEndpoint) bool {
	return have == nil || have.UID != ep.UID || rv(ep) >= rv(have)
}

// observe takes a change of one of this node's objects from the watch,
// unless the writer already has a newer version of it.
func (w *writer) observe(ep *k8sapi.CelliumEndpoint, deleted bool) {
	key := ep.Namespace + "/" + ep.Name
	w.mu.Lock()
	have := w.own[key]
	switch {
	case deleted:
		if have != nil && have.UID == ep.UID {
			delete(w.own, key)
		}
	case supersedes(ep, have):
		w.own[key] = ep
	}
	w.mu.Unlock()
	w.poke()
}

func (w *writer) record(key string, ep *k8sapi.CelliumEndpoint) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ep == nil {
		delete(w.own, key)
		return
	}
	if supersedes(ep, w.own[key]) {
		w.own[key] = ep
	}
}

// leanPod keeps of a pod what its object needs: name, UID, and the named
// ports of its containers and sidecars (k8sapi.NamedPortContainers), all
// as containers.
func leanPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec: corev1.PodSpec{Containers: k8sapi.NamedPortContainers(pod)}}, nil
}

func (w *writer) run(ctx context.Context, health cell.Health) error {
	s := w.s
	select {
	case <-s.registered:
	case <-ctx.Done():
		return nil
	}
	podInf := k8sclient.NewInformer(s.cs, s.cs.CoreV1().Pods(metav1.NamespaceAll), &corev1.Pod{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.node).String()
	})
	factory := k8sclient.NewInformers(podInf)
	if err := podInf.SetTransform(leanPod); err != nil {
		return err
	}
	reg, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { w.poke() }, UpdateFunc: func(any, any) { w.poke() }, DeleteFunc: func(any) { w.poke() },
	})
	if err != nil {
		return err
	}
	factory.Start(ctx)
	defer factory.Shutdown()
	if !cache.WaitFor(ctx, "", reg.HasSyncedChecker()) {
		return nil
	}
	// Before anything is deleted: every object listed, every endpoint
	// restored.
	select {
	case <-w.synced:
	case <-ctx.Done():
		return nil
	}
	if tables.WaitInitialized(ctx, s.db, s.eps) != nil {
		return nil
	}
	resync := time.NewTicker(s.cfg.EndpointObjectsResync)
	defer resync.Stop()
	retryAfter := backoff.Jittered{Min: time.Second, Max: time.Minute}
	for {
		txn := s.db.ReadTxn()
		all, epsChanged := s.eps.AllWatch(txn)
		_, nodesChanged := s.nodes.AllWatch(txn)
		var nodeIP string
		if local, ok := nodes.LocalNode(txn, s.nodes); ok && local.PrimaryIP().IsValid() {
			nodeIP = local.PrimaryIP().String()
		}
		want, keep := map[string]*k8sapi.CelliumEndpoint{}, map[string]bool{}
		for ep := range all {
			if ep.Health || ep.PodName == "" {
				continue
			}
			key := ep.PodNamespace + "/" + ep.PodName
			keep[key] = true
			obj, ok, _ := podInf.GetStore().GetByKey(key)
			if !ok || ep.IdentityPending || len(ep.IPs()) == 0 || !publishable(ep.Identity) {
				// Left as it is until the endpoint settles.
				continue
			}
			want[key] = w.object(ep, obj.(*corev1.Pod), nodeIP)
		}
		var retry <-chan time.Time
		if n, err := w.sync(ctx, want, keep); err != nil {
			wait := retryAfter.Wait()
			health.Degraded(fmt.Sprintf("Writing this node's CelliumEndpoint objects; again in %s", wait.Round(time.Millisecond)), err)
			retry = time.After(wait)
		} else {
			retryAfter.Reset()
			health.OK(fmt.Sprintf("%d CelliumEndpoint objects of this node written", n))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-epsChanged:
		case <-nodesChanged:
		case <-w.wake:
		case <-resync.C:
		case <-retry:
		}
	}
}

// object is the CelliumEndpoint of a local endpoint.
func (w *writer) object(ep *endpointmanager.Endpoint, pod *corev1.Pod, nodeIP string) *k8sapi.CelliumEndpoint {
	out := &k8sapi.CelliumEndpoint{
		ObjectMeta: metav1.ObjectMeta{Name: ep.PodName, Namespace: ep.PodNamespace,
			Labels:          map[string]string{k8sapi.LabelNode: w.s.node},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}},
		Status: k8sapi.EndpointStatus{Identity: uint32(ep.Identity), NodeName: w.s.node, NodeIP: nodeIP},
	}
	for _, ip := range ep.IPs() {
		out.Status.Addresses = append(out.Status.Addresses, ip.String())
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			proto := string(p.Protocol)
			if proto == "" {
				proto = "TCP"
			}
			out.Status.NamedPorts = append(out.Status.NamedPorts, k8sapi.NamedPort{Name: p.Name, Port: uint16(p.ContainerPort), Protocol: proto})
		}
	}
	return out
}

// same says whether the API server's object have says what want does.
func same(have, want *k8sapi.CelliumEndpoint) bool {
	return reflect.DeepEqual(have.Status, want.Status) && have.Labels[k8sapi.LabelNode] == want.Labels[k8sapi.LabelNode] &&
		reflect.DeepEqual(have.OwnerReferences, want.OwnerReferences)
}

// sync writes the objects that differ from want and deletes this node's
// objects of endpoints that are gone (not in keep). It returns how many
// objects this node has.
func (w *writer) sync(ctx context.Context, want map[string]*k8sapi.CelliumEndpoint, keep map[string]bool) (int, error) {
	w.mu.Lock()
	own := make(map[string]*k8sapi.CelliumEndpoint, len(w.own))
	for k, v := range w.own {
		own[k] = v
	}
	w.mu.Unlock()
	var firstErr error
	fail := func(err error) {
		if firstErr == nil {
			firstErr = err
		}
	}
	client := w.s.client
	for key, obj := range want {
		have := own[key]
		switch {
		case have == nil:
			created, err := client.CreateEndpoint(ctx, obj)
			switch {
			case apierrors.IsAlreadyExists(err):
				// Another writer's (a node the pod was on before, say):
				// the watch brings it, and the next pass replaces it.
			case err != nil:
				fail(fmt.Errorf("create CelliumEndpoint %s: %w", key, err))
			default:
				w.record(key, created)
			}
		case !same(have, obj):
			obj = obj.DeepCopy()
			obj.ResourceVersion = have.ResourceVersion
			updated, err := client.UpdateEndpoint(ctx, obj)
			switch {
			case apierrors.IsConflict(err), apierrors.IsNotFound(err):
				// Changed or gone meanwhile: the watch brings the news.
			case err != nil:
				fail(fmt.Errorf("update CelliumEndpoint %s: %w", key, err))
			default:
				w.record(key, updated)
			}
		}
	}
	for key, have := range own {
		if want[key] != nil || keep[key] {
			continue
		}
		err := client.DeleteEndpoint(ctx, have.Namespace, have.Name, have.UID)
		switch {
		case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
			w.record(key, nil)
			if err == nil {
				w.s.log.Info("Deleted a stale CelliumEndpoint of this node", "endpoint", key)
			}
		default:
			fail(fmt.Errorf("delete stale CelliumEndpoint %s: %w", key, err))
		}
	}
	return len(want), firstErr
}
