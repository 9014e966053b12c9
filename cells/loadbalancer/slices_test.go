package loadbalancer

import (
	"maps"
	"testing"
)

// sliceServices gives back each slice's service, forgets a namespace with
// its last slice, and lists every slice even when the caller deletes as it
// goes (as a relist does).
func TestSliceServices(t *testing.T) {
	m := sliceServices{}
	want := map[sliceID]string{
		{"shop", "web-abcde"}: "web", {"shop", "web-fghij"}: "web", {"shop", "db-1"}: "db",
		{"kube-system", "kube-dns-xyz"}: "kube-dns", {"other", "web-abcde"}: "web2",
	}
	for id, svc := range want {
		m.set(id, svc)
	}
	m.set(sliceID{"shop", "db-1"}, "db") // again: no second entry
	for id, svc := range want {
		if got, ok := m.get(id); !ok || got != svc {
			t.Errorf("get %s = %q, %v; want %q", id, got, ok, svc)
		}
	}
	if _, ok := m.get(sliceID{"shop", "web-klmno"}); ok {
		t.Error("a slice never set was found")
	}
	listed := map[sliceID]string{}
	for id := range m.all() {
		listed[id], _ = m.get(id)
		m.delete(id)
	}
	if !maps.Equal(listed, want) {
		t.Errorf("all() listed %v, want %v", listed, want)
	}
	if len(m) != 0 {
		t.Errorf("%d namespaces left after deleting every slice: %v", len(m), m)
	}
}
