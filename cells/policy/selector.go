package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	idcell "github.com/cellium/cellium/cells/identity"
	"github.com/cellium/cellium/pkg/identity"
	"github.com/cellium/cellium/pkg/labels"
)

// namespaceNameLabel is the label the API server gives every namespace:
// its name. Identities keep the namespace's name under their own key and
// the default --labels filter drops kubernetes.io/* labels, so it is put
// back from the name for namespace selectors to see.
const namespaceNameLabel = "kubernetes.io/metadata.name"

// peerSelector is a NetworkPolicy peer of pod and namespace selectors:
// the pods it selects, as identities.
type peerSelector struct {
	// key is the selector's text, the same for equal selectors of any
	// policy: "ns=NAMESPACE pods{SELECTOR}" for a podSelector alone,
	// "ns{SELECTOR} pods{SELECTOR}" with a namespaceSelector.
	key string
	// namespace is the policy's namespace, for a podSelector alone.
	namespace string
	// ns is nil for a podSelector alone.
	ns  k8slabels.Selector
	pod k8slabels.Selector
}

func newPeerSelector(policyNamespace string, pod, ns *metav1.LabelSelector) (*peerSelector, error) {
	if pod == nil && ns == nil {
		return nil, fmt.Errorf("a peer needs a podSelector, a namespaceSelector or an ipBlock")
	}
	s := &peerSelector{pod: k8slabels.Everything()}
	if pod != nil {
		sel, err := metav1.LabelSelectorAsSelector(pod)
		if err != nil {
			return nil, fmt.Errorf("podSelector: %w", err)
		}
		s.pod = sel
	}
	if ns == nil {
		s.namespace = policyNamespace
		s.key = fmt.Sprintf("ns=%s pods{%s}", policyNamespace, s.pod)
		return s, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(ns)
	if err != nil {
		return nil, fmt.Errorf("namespaceSelector: %w", err)
	}
	s.ns = sel
	s.key = fmt.Sprintf("ns{%s} pods{%s}", sel, s.pod)
	return s, nil
}

func (s *peerSelector) matches(v *identView) bool {
	if s.ns == nil {
		if v.namespace != s.namespace {
			return false
		}
	} else if !s.ns.Matches(v.nsLabels) {
		return false
	}
	return s.pod.Matches(v.podLabels)
}

// identView is a pod identity's labels as selectors see them.
type identView struct {
	namespace string
	podLabels k8slabels.Set
	nsLabels  k8slabels.Set
	// group names the identities of one namespace with the same
	// namespace labels: a namespace selector is matched once per group.
	group string
	// portKey is the text of the identity's label set without its
	// namespace's labels: the pods with this identity are those whose
	// label set has this text (podPorts.identityKey), which egress named
	// ports resolve on.
	portKey string
	// text is the identity's whole label set: a number seen again with
	// another label set is a new identity.
	text string
}

// idGroup is the identities of one group.
type idGroup struct {
	nsLabels k8slabels.Set
	ids      map[identity.NumericIdentity]*identView
}

// viewOf reads the labels of a pod identity (cells/identity's PodLabels);
// other identities (reserved, CIDR) are no pod's and get nil.
func viewOf(ls labels.Labels) *identView {
	ns, ok := ls.Get(labels.SourceK8s, idcell.NamespaceLabel)
	if !ok {
		return nil
	}
	v := &identView{namespace: ns, podLabels: k8slabels.Set{}, nsLabels: k8slabels.Set{namespaceNameLabel: ns}, text: ls.String()}
	own := make([]labels.Label, 0, len(ls))
	for _, l := range ls {
		if l.Source != labels.SourceK8s || !strings.HasPrefix(l.Key, idcell.NamespaceLabelsPrefix) {
			own = append(own, l)
		}
		switch {
		case l.Source != labels.SourceK8s || l.Key == idcell.NamespaceLabel || l.Key == idcell.ServiceAccountLabel:
		case strings.HasPrefix(l.Key, idcell.NamespaceLabelsPrefix):
			v.nsLabels[strings.TrimPrefix(l.Key, idcell.NamespaceLabelsPrefix)] = l.Value
		default:
			v.podLabels[l.Key] = l.Value
		}
	}
	v.group = v.nsLabels.String()
	v.portKey = labels.New(own...).String()
	return v
}

// cachedSelector is a selector, the identities it selects now and the
// policies that use it.
type cachedSelector struct {
	sel   *peerSelector
	ids   map[identity.NumericIdentity]struct{}
	users map[string]struct{}
}

// selectorCache keeps every selector of the applied policies and the
// identities each selects, updated as identities come and go: a new
// identity is matched against the selectors of its namespace and those
// with a namespaceSelector, not against all.
type selectorCache struct {
	ids map[identity.NumericIdentity]*identView
	// groups are the identities by namespace, then by group.
	groups map[string]map[string]*idGroup
	sels   map[string]*cachedSelector
	// byNamespace holds the podSelector-alone selectors by namespace;
	// anyNamespace those with a namespaceSelector.
	byNamespace  map[string]map[string]*cachedSelector
	anyNamespace map[string]*cachedSelector
}

func newSelectorCache() *selectorCache {
	return &selectorCache{
		ids:          map[identity.NumericIdentity]*identView{},
		groups:       map[string]map[string]*idGroup{},
		sels:         map[string]*cachedSelector{},
		byNamespace:  map[string]map[string]*cachedSelector{},
		anyNamespace: map[string]*cachedSelector{},
	}
}

// acquire counts user as a user of sel, adding sel with the identities it
// selects if it is new.
func (c *selectorCache) acquire(sel *peerSelector, user string) {
	cs, ok := c.sels[sel.key]
	if !ok {
		cs = &cachedSelector{sel: sel, ids: map[identity.NumericIdentity]struct{}{}, users: map[string]struct{}{}}
		c.scan(sel, func(id identity.NumericIdentity) { cs.ids[id] = struct{}{} })
		c.sels[sel.key] = cs
		if sel.ns == nil {
			if c.byNamespace[sel.namespace] == nil {
				c.byNamespace[sel.namespace] = map[string]*cachedSelector{}
			}
			c.byNamespace[sel.namespace][sel.key] = cs
		} else {
			c.anyNamespace[sel.key] = cs
		}
	}
	cs.users[user] = struct{}{}
}

// scan calls found with each identity sel selects: those of its
// namespace, or those of the groups its namespace selector matches.
func (c *selectorCache) scan(sel *peerSelector, found func(identity.NumericIdentity)) {
	scanGroup := func(g *idGroup) {
		for id, v := range g.ids {
			if sel.pod.Matches(v.podLabels) {
				found(id)
			}
		}
	}
	if sel.ns == nil {
		for _, g := range c.groups[sel.namespace] {
			scanGroup(g)
		}
		return
	}
	for _, groups := range c.groups {
		for _, g := range groups {
			if sel.ns.Matches(g.nsLabels) {
				scanGroup(g)
			}
		}
	}
}

// release drops user's use of the selector key; the last user removes it.
func (c *selectorCache) release(key, user string) {
	cs, ok := c.sels[key]
	if !ok {
		return
	}
	delete(cs.users, user)
	if len(cs.users) > 0 {
		return
	}
	delete(c.sels, key)
	if cs.sel.ns == nil {
		delete(c.byNamespace[cs.sel.namespace], key)
		if len(c.byNamespace[cs.sel.namespace]) == 0 {
			delete(c.byNamespace, cs.sel.namespace)
		}
	} else {
		delete(c.anyNamespace, key)
	}
}

// candidates are the selectors that may select a pod of namespace.
func (c *selectorCache) candidates(namespace string, yield func(*cachedSelector)) {
	for _, cs := range c.byNamespace[namespace] {
		yield(cs)
	}
	for _, cs := range c.anyNamespace {
		yield(cs)
	}
}

// addIdentity adds an identity and calls changed with each selector that
// now selects it. A number already known with the same labels is left
// alone; with other labels it is removed first and added as new: statedb
// gives a delete and a re-insert of one number in one batch as an insert
// only, local mode gives a released number to the next label set at once,
// and in crd and kvstore modes an identity's labels can be edited.
func (c *selectorCache) addIdentity(id identity.NumericIdentity, ls labels.Labels, changed func(*cachedSelector)) {
	if old, ok := c.ids[id]; ok {
		if old.text == ls.String() {
			return
		}
		c.removeIdentity(id, changed)
	}
	v := viewOf(ls)
	if v == nil {
		return
	}
	c.ids[id] = v
	groups := c.groups[v.namespace]
	if groups == nil {
		groups = map[string]*idGroup{}
		c.groups[v.namespace] = groups
	}
	g := groups[v.group]
	if g == nil {
		g = &idGroup{nsLabels: v.nsLabels, ids: map[identity.NumericIdentity]*identView{}}
		groups[v.group] = g
	}
	g.ids[id] = v
	c.candidates(v.namespace, func(cs *cachedSelector) {
		if cs.sel.matches(v) {
			cs.ids[id] = struct{}{}
			changed(cs)
		}
	})
}

// removeIdentity removes an identity and calls changed with each selector
// that selected it.
func (c *selectorCache) removeIdentity(id identity.NumericIdentity, changed func(*cachedSelector)) {
	v, ok := c.ids[id]
	if !ok {
		return
	}
	delete(c.ids, id)
	groups := c.groups[v.namespace]
	delete(groups[v.group].ids, id)
	if len(groups[v.group].ids) == 0 {
		delete(groups, v.group)
		if len(groups) == 0 {
			delete(c.groups, v.namespace)
		}
	}
	c.candidates(v.namespace, func(cs *cachedSelector) {
		if _, ok := cs.ids[id]; ok {
			delete(cs.ids, id)
			changed(cs)
		}
	})
}

// selection are the identities the selector key selects (nil for an
// unknown key); the caller does not change it.
func (c *selectorCache) selection(key string) map[identity.NumericIdentity]struct{} {
	if cs, ok := c.sels[key]; ok {
		return cs.ids
	}
	return nil
}

// identities are the identities the selector key selects, in order.
func (c *selectorCache) identities(key string) []identity.NumericIdentity {
	cs, ok := c.sels[key]
	if !ok {
		return nil
	}
	return slices.Sorted(maps.Keys(cs.ids))
}
