// Package labels is the label set a security identity stands for.
//
// A label has a source, a key and a value, and is written
// "source:key=value" ("k8s:app=web", "reserved:host"; a label with an
// empty value is "source:key"). A Labels value is a set: sorted by source,
// then key, with one label per source and key. Its String form, the
// labels joined with ";", is canonical: two equal sets have the same
// string, which is how the identity allocator keys them in the kvstore.
package labels

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Sources of labels.
const (
	// SourceK8s: from Kubernetes (the pod's labels, its namespace, ...).
	SourceK8s = "k8s"
	// SourceReserved: the labels of the reserved identities.
	SourceReserved = "reserved"
	// SourceCIDR: the labels of CIDR identities.
	SourceCIDR = "cidr"
)

// Label is one label.
type Label struct {
	Source string `json:"source"`
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
}

func (l Label) String() string {
	if l.Value == "" {
		return l.Source + ":" + l.Key
	}
	return l.Source + ":" + l.Key + "=" + l.Value
}

// ParseLabel reads "source:key=value" or "source:key". A label without a
// source ("app=web") is a k8s label.
func ParseLabel(s string) (Label, error) {
	var l Label
	rest := s
	if src, after, ok := strings.Cut(s, ":"); ok && !strings.Contains(src, "=") {
		l.Source, rest = src, after
	} else {
		l.Source = SourceK8s
	}
	l.Key, l.Value, _ = strings.Cut(rest, "=")
	if l.Source == "" || l.Key == "" || strings.ContainsAny(s, ";\n") {
		return Label{}, fmt.Errorf("label %q: want source:key=value, such as k8s:app=web", s)
	}
	return l, nil
}

// Labels is a set of labels, sorted by source then key. Build one with New,
// FromMap or Parse; do not change it in place (it may be shared).
type Labels []Label

func compare(a, b Label) int {
	if c := strings.Compare(a.Source, b.Source); c != 0 {
		return c
	}
	return strings.Compare(a.Key, b.Key)
}

// New is the set of ls: sorted, and of two labels with one source and key,
// the later one.
func New(ls ...Label) Labels {
	out := slices.Clone(ls)
	slices.SortStableFunc(out, compare)
	// Keep the last of each run of equal source and key.
	n := 0
	for i, l := range out {
		if i+1 < len(out) && compare(l, out[i+1]) == 0 {
			continue
		}
		out[n] = l
		n++
	}
	return Labels(out[:n])
}

// FromMap is the set of a key/value map's labels, all from source.
func FromMap(source string, m map[string]string) Labels {
	ls := make([]Label, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		ls = append(ls, Label{Source: source, Key: k, Value: m[k]})
	}
	return New(ls...)
}

// Parse reads the String form of a set: labels joined by ";".
func Parse(s string) (Labels, error) {
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(strings.TrimSuffix(s, ";"), ";")
	ls := make([]Label, 0, len(parts))
	for _, p := range parts {
		l, err := ParseLabel(p)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
	}
	return New(ls...), nil
}

// String is the canonical form of the set: its labels joined by ";".
func (ls Labels) String() string { return strings.Join(ls.Strings(), ";") }

// Strings is every label's String form, in order.
func (ls Labels) Strings() []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.String()
	}
	return out
}

// Equal says whether two sets have the same labels.
func (ls Labels) Equal(o Labels) bool { return slices.Equal(ls, o) }

// Has says whether the set has a label with l's source, key and value.
func (ls Labels) Has(l Label) bool {
	i, ok := slices.BinarySearchFunc(ls, l, compare)
	return ok && ls[i].Value == l.Value
}

// Get is the value of the label with source and key.
func (ls Labels) Get(source, key string) (string, bool) {
	i, ok := slices.BinarySearchFunc(ls, Label{Source: source, Key: key}, compare)
	if !ok {
		return "", false
	}
	return ls[i].Value, true
}
