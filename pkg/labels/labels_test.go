package labels

import "testing"

func TestCanonicalString(t *testing.T) {
	a := New(
		Label{Source: SourceK8s, Key: "io.kubernetes.pod.namespace", Value: "default"},
		Label{Source: SourceK8s, Key: "app", Value: "old"},
		Label{Source: SourceK8s, Key: "app", Value: "web"},
	)
	b := FromMap(SourceK8s, map[string]string{"io.kubernetes.pod.namespace": "default", "app": "web"})
	const want = "k8s:app=web;k8s:io.kubernetes.pod.namespace=default"
	if a.String() != want || b.String() != want || !a.Equal(b) {
		t.Fatalf("got %q and %q, want both %q", a, b, want)
	}
	parsed, err := Parse(want + ";")
	if err != nil || !parsed.Equal(a) {
		t.Fatalf("Parse(%q) = %v, %v; want %v", want, parsed, err, a)
	}
	if v, ok := a.Get(SourceK8s, "app"); !ok || v != "web" {
		t.Fatalf("Get app = %q, %v", v, ok)
	}
	if !a.Has(Label{Source: SourceK8s, Key: "app", Value: "web"}) || a.Has(Label{Source: SourceK8s, Key: "app", Value: "old"}) {
		t.Fatal("Has does not compare the value")
	}
}

func TestParseLabel(t *testing.T) {
	for in, want := range map[string]Label{
		"k8s:app=web":   {Source: "k8s", Key: "app", Value: "web"},
		"reserved:host": {Source: "reserved", Key: "host"},
		"app=a:b":       {Source: "k8s", Key: "app", Value: "a:b"},
	} {
		got, err := ParseLabel(in)
		if err != nil || got != want {
			t.Errorf("ParseLabel(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ":app", "k8s:", "k8s:a;b", "k8s:a\nb"} {
		if _, err := ParseLabel(bad); err == nil {
			t.Errorf("ParseLabel(%q) accepted", bad)
		}
	}
}
