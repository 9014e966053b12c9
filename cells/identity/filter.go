package identity

import (
	"fmt"
	"strings"

	"github.com/cellium/cellium/pkg/labels"
)

// Keys of the labels a pod's identity has besides its own labels, all with
// source k8s.
const (
	// NamespaceLabel: the pod's namespace.
	NamespaceLabel = "io.kubernetes.pod.namespace"
	// ServiceAccountLabel: the pod's service account.
	ServiceAccountLabel = "io.cellium.k8s.policy.serviceaccount"
	// NamespaceLabelsPrefix, followed by a label key of the pod's
	// namespace: that namespace label.
	NamespaceLabelsPrefix = "io.cellium.k8s.namespace.labels."
)

// defaultLabelFilter drops the labels that differ between pods of one
// workload: with them, every pod would have an identity of its own.
var defaultLabelFilter = []string{
	"!pod-template-hash",
	"!controller-revision-hash",
	"!pod-template-generation",
	"!statefulset.kubernetes.io/pod-name",
	"!apps.kubernetes.io/pod-index",
	"!batch.kubernetes.io/*",
	"!controller-uid",
	"!job-name",
	"!kubernetes.io/*",
}

// labelFilter decides which pod labels go into an identity. Each pattern
// is a label key, or a key prefix ending in *; a pattern starting with !
// drops what it matches. A label is kept when no drop pattern matches it
// and, if there are keep patterns, one of them does.
type labelFilter struct {
	keep, drop []string
}

func parseLabelFilter(patterns []string) (labelFilter, error) {
	var f labelFilter
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		drop := strings.HasPrefix(p, "!")
		key := strings.TrimPrefix(p, "!")
		body := strings.TrimSuffix(key, "*")
		if body == "" || strings.ContainsAny(body, "*=;:! \t\n") {
			return f, fmt.Errorf("invalid --labels pattern %q: want a label key or key prefix ending in *, with a leading ! to drop it (e.g. !pod-template-hash, app.kubernetes.io/*)", p)
		}
		if drop {
			f.drop = append(f.drop, key)
		} else {
			f.keep = append(f.keep, key)
		}
	}
	return f, nil
}

func match(pattern, key string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(key, prefix)
	}
	return pattern == key
}

func (f labelFilter) accepts(key string) bool {
	for _, p := range f.drop {
		if match(p, key) {
			return false
		}
	}
	if len(f.keep) == 0 {
		return true
	}
	for _, p := range f.keep {
		if match(p, key) {
			return true
		}
	}
	return false
}

// Pod is what a pod's identity is made of, as the API server tells it.
type Pod struct {
	Namespace       string
	Labels          map[string]string
	ServiceAccount  string
	NamespaceLabels map[string]string
}

// PodLabels is the label set of a pod's identity, all from source k8s: the
// pod's labels and its namespace's labels that the filter keeps (the
// latter under NamespaceLabelsPrefix), its namespace and its service
// account.
func (a *Allocator) PodLabels(p Pod) labels.Labels {
	ls := make([]labels.Label, 0, len(p.Labels)+len(p.NamespaceLabels)+2)
	add := func(k, v string) { ls = append(ls, labels.Label{Source: labels.SourceK8s, Key: k, Value: v}) }
	for k, v := range p.Labels {
		if k != NamespaceLabel && k != ServiceAccountLabel && !strings.HasPrefix(k, NamespaceLabelsPrefix) && a.filter.accepts(k) {
			add(k, v)
		}
	}
	for k, v := range p.NamespaceLabels {
		if a.filter.accepts(k) {
			add(NamespaceLabelsPrefix+k, v)
		}
	}
	if p.Namespace != "" {
		add(NamespaceLabel, p.Namespace)
	}
	if p.ServiceAccount != "" {
		add(ServiceAccountLabel, p.ServiceAccount)
	}
	return labels.New(ls...)
}
