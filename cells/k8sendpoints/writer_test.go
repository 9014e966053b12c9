package k8sendpoints

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/cellium/cellium/pkg/k8sapi"
)

// The writer keeps the newest version of each of its objects, whichever of
// the watch (observe) and its own writes (record) brings it first: an older
// version of the same object never replaces a newer one, another object of
// the same name (UID) always does, and a deletion takes away only the
// object it names.
func TestWriterKeepsNewest(t *testing.T) {
	obj := func(uid, rv string) *k8sapi.CelliumEndpoint {
		return &k8sapi.CelliumEndpoint{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod", UID: types.UID(uid), ResourceVersion: rv}}
	}
	const key = "ns/pod"
	w := newWriter(&syncer{})
	want := func(step, uid, rv string) {
		t.Helper()
		have, wanted := "none", "none"
		if got := w.own[key]; got != nil {
			have = string(got.UID) + "@" + got.ResourceVersion
		}
		if uid != "" {
			wanted = uid + "@" + rv
		}
		if have != wanted {
			t.Fatalf("%s: have %s, want %s", step, have, wanted)
		}
	}
	w.record(key, obj("a", "5"))
	w.observe(obj("a", "3"), false)
	want("older version from the watch", "a", "5")
	w.record(key, obj("a", "4"))
	want("older version recorded", "a", "5")
	w.observe(obj("a", "7"), false)
	want("newer version from the watch", "a", "7")
	w.observe(obj("b", "2"), false)
	want("another object of the name", "b", "2")
	w.observe(obj("a", "8"), true)
	want("deletion of the other object", "b", "2")
	w.observe(obj("b", "2"), true)
	want("deletion", "", "")
}
