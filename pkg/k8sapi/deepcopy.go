package k8sapi

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopy returns a copy of i that shares nothing with it.
func (i *CelliumIdentity) DeepCopy() *CelliumIdentity {
	if i == nil {
		return nil
	}
	out := *i
	i.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec.Labels = slices.Clone(i.Spec.Labels)
	return &out
}

func (i *CelliumIdentity) DeepCopyObject() runtime.Object { return i.DeepCopy() }

func (l *CelliumIdentityList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = deepCopyItems(l.Items, (*CelliumIdentity).DeepCopy)
	return &out
}

// DeepCopy returns a copy of e that shares nothing with it.
func (e *CelliumEndpoint) DeepCopy() *CelliumEndpoint {
	if e == nil {
		return nil
	}
	out := *e
	e.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Status.Addresses = slices.Clone(e.Status.Addresses)
	out.Status.NamedPorts = slices.Clone(e.Status.NamedPorts)
	return &out
}

func (e *CelliumEndpoint) DeepCopyObject() runtime.Object { return e.DeepCopy() }

func (l *CelliumEndpointList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	out.Items = deepCopyItems(l.Items, (*CelliumEndpoint).DeepCopy)
	return &out
}

// deepCopyItems is a list's items, each copied with deepCopy.
func deepCopyItems[T any](items []T, deepCopy func(*T) *T) []T {
	out := make([]T, len(items))
	for n := range items {
		out[n] = *deepCopy(&items[n])
	}
	return out
}
