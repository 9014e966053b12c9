// Package k8sclient provides the Clientset through which the agent talks to
// Kubernetes: a real API server, or, with no cluster, an embedded one (a
// Fake: a chain of reactors over an object store) serving the objects of a
// directory of manifests. The same informers and reflectors run against
// either.
//
// The Clientset has the typed clients of the kinds the agent uses
// (groups.go), built on pkg/kubeclient: the typed clients' methods over a
// REST client of a scheme of four API groups, or over the embedded
// server (kubeclient.Server). client-go's generated clients, its informer
// factory and its fake clientset are not linked: each imports client-go's
// scheme of every API group, whose registration was most of the agent's
// idle memory (see pkg/kubeclient). Nor is client-go's testing package
// (the fake's reactors and object tracker) or its generic client
// (gentype, which imports it): they linked strategic merge patch, managed
// fields and the OpenAPI models, ~50 packages.
//
// # Modes
//
// --k8s-mode=auto (the default) picks, in this order: kubeconfig mode when
// --kubeconfig is set; embedded mode when --k8s-manifests-dir is set to
// something other than its default; in-cluster mode in a pod
// (KUBERNETES_SERVICE_HOST set and a service account token present);
// embedded mode otherwise. in-cluster, kubeconfig and embedded force one;
// contradicting flags are an error. $KUBECONFIG is not read.
//
// # Embedded mode: the contract
//
//   - Before any cell that takes the Clientset starts, the directory's
//     objects are in the embedded API server: the initial load is this
//     cell's start hook. A reflector's first LIST therefore sees them all,
//     and can mark its table initialized.
//   - Files named *.yaml, *.yml and *.json directly in the directory hold
//     objects of the built-in kinds of kubeclient.Scheme's API groups (v1,
//     discovery.k8s.io/v1, networking.k8s.io/v1, coordination.k8s.io/v1),
//     several per file separated by "---". An object of another API group
//     is an error of its file naming the groups served.
//     An object is identified by apiVersion, kind, namespace and name;
//     namespaced objects without a namespace are in "default".
//   - Adding, editing, renaming or removing files, including an editor's
//     rename-over and a mounted ConfigMap's "..data" symlink swap, shows as
//     ADDED, MODIFIED and DELETED events for exactly the objects that
//     changed, within a second. Unchanged objects are not written; an
//     object that moves to another file is at most MODIFIED.
//   - A file that does not decode changes nothing: its objects stay as
//     they were until it decodes again, and other files still apply. The
//     module's health is Degraded, and the table "k8s-manifests" and the
//     log name the file, line and document. Two files defining the same
//     object are an error of the one that did not define it first.
//   - The agent's own Node (daemon.NodeName) exists even when no manifest
//     defines it, as a kubelet would have registered it: labelled, without
//     pod CIDRs. A manifest of that Node replaces it.
//   - An object the agent wrote is written again only when its manifest
//     changes; changes other cells make to it last until then. Objects
//     other cells create are left alone.
//
// The embedded API server answers through reactors in the manner of
// client-go's fake clientset (fake.go: a test may put its own in front),
// and does what that fake does: no defaulting (write "protocol: TCP"), no
// validation beyond decoding, no conversion between API versions, no
// resource versions in objects, and watches ignore label and field
// selectors (lists honour labels). Its patches are the ones the agent
// sends (patch.go): JSON patch, merge patch, and a strategic merge patch
// whose only list is status.conditions, merged by type; anything else,
// server-side apply included, is a BadRequest naming it. Its watches are
// better than client-go's fake's, in the ways informers notice: they never
// overflow (the fake's panic once 100 events wait), a watch from a list's
// resource version first reports the objects deleted since the list (the
// fake loses them, and the informer keeps them for good), and streaming
// lists work.
//
// # Informers
//
// Informers and reflectors need no special setup with either mode. client-go
// v0.37 asks for streaming lists by default (WatchListClient); every
// informer and reflector of the agent lists in pages instead, also where
// the API server can stream (kubeclient.Paged: NewInformer uses it). A
// reflector over a hand-made cache.ListWatch does ask for a streaming list,
// and the embedded server gives one.
//
//	services := k8sclient.NewInformer(cs, cs.CoreV1().Services(""), &corev1.Service{}, nil)
//	informers := k8sclient.NewInformers(services)
//	informers.Start(ctx)
//	defer informers.Shutdown()
//
// Tests of other cells use k8sclienttest.Cell in place of Cell. It provides
// the Clientset and the *k8sclient.Fake behind it; write through its typed
// clients, or k8sclienttest's Create, Update, Delete and script commands:
//
//	h := hive.New(k8sclienttest.Cell(&corev1.Service{...}), myCell)
package k8sclient
