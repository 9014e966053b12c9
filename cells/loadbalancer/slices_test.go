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

// A listing's names are found whatever order they came in: the API
// server's (by namespace, then name), another, with repeats.
func TestListedNames(t *testing.T) {
	in := []ServiceName{{"shop", "web"}, {"default", "kubernetes"}, {"shop", "db"}, {"default", "kubernetes"}, {"kube-system", "dns"}}
	l := newListed(ServiceName.compare)
	for _, n := range in {
		l.add(n)
	}
	l.sort()
	for _, n := range in {
		if !l.has(n) {
			t.Errorf("%s listed, not found", n)
		}
	}
	for _, n := range []ServiceName{{"shop", "dbx"}, {"shop", ""}, {"", "web"}, {"kube-system", "web"}, {"zz", "a"}} {
		if l.has(n) {
			t.Errorf("%s not listed, found", n)
		}
	}
}
