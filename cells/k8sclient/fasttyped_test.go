package k8sclient

import (
	"reflect"
	"testing"

	kjson "sigs.k8s.io/json"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// fastTypedAccepted are documents the hand decoder takes: every field it
// knows, in full and empty.
var fastTypedAccepted = []struct {
	gvk schema.GroupVersionKind
	js  string
}{
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"shop","labels":{"app":"web","a.b/c":"x y"},"annotations":{"note":"it's"}},` +
		`"spec":{"type":"LoadBalancer","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10","fd00::10"],"selector":{"app":"web"},` +
		`"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080,"nodePort":30080,"appProtocol":"http"},{"port":53,"protocol":"UDP","targetPort":"dns"}],` +
		`"externalIPs":["192.0.2.1"],"sessionAffinity":"ClientIP","externalTrafficPolicy":"Local","internalTrafficPolicy":"Cluster",` +
		`"ipFamilies":["IPv4","IPv6"],"ipFamilyPolicy":"PreferDualStack","healthCheckNodePort":31000,"loadBalancerIP":"192.0.2.9",` +
		`"publishNotReadyAddresses":true,"allocateLoadBalancerNodePorts":false,"externalName":""}}`},
	{serviceGVK, " {\n \"kind\" : \"Service\" , \"apiVersion\":\"v1\",\"metadata\":{},\"spec\":{\"ports\":[],\"selector\":{},\"clusterIPs\":[]}} \n"},
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"n"},"spec":{"ports":[{"port":-0,"targetPort":-2147483648,"nodePort":2147483647}]}}`},
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"ünïcode ✓"}}`},
	{endpointSliceGVK, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-x","namespace":"shop","labels":{"kubernetes.io/service-name":"web"}},` +
		`"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP","appProtocol":"http"},{}],` +
		`"endpoints":[{"addresses":["10.0.0.1","10.0.0.2"],"conditions":{"ready":true,"serving":false,"terminating":false},"nodeName":"n1","zone":"z","hostname":"h"},{"addresses":[],"conditions":{}}]}`},
	{endpointSliceGVK, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"e"},"addressType":"IPv6","endpoints":[],"ports":[]}`},
}

// fastTypedDeclined are documents the hand decoder must leave to the codec:
// what it does not know, and what the codec refuses or reads differently.
var fastTypedDeclined = []struct {
	gvk schema.GroupVersionKind
	js  string
}{
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","uid":"x"}}`},                           // a field it does not know
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","status":{}}`},                                                 // same
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"Name":"a"}}`},                                     // a case variant
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","name":"b"}}`},                          // a duplicate field
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"labels":{"a":"1","a":"2"}}}`},                     // a duplicate key
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":null}`},                                             // a null
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a\"b"}}`},                                  // an escape
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"a` + "\xff" + `"}}`},                       // not UTF-8
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"port":80.0}]}}`},                            // a fraction
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"port":8e1}]}}`},                             // an exponent
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"port":2147483648}]}}`},                      // out of range
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"port":080}]}}`},                             // a leading zero
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"ports":[{"port":"80"}]}}`},                            // a string for a number
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"publishNotReadyAddresses":"true"}}`},                  // a string for a bool
	{serviceGVK, `{"apiVersion":"v1","kind":"Service","spec":{"publishNotReadyAddresses":truex}}`},                   // not JSON
	{serviceGVK, `{"apiVersion":"v1","kind":"Service"} {}`},                                                          // something after
	{serviceGVK, `{"apiVersion":"v1","kind":"Service",}`},                                                            // a trailing comma
	{serviceGVK, `{"apiVersion":"v1","kind":"Service"`},                                                              // cut short
	{endpointSliceGVK, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","endpoints":[{"targetRef":{}}]}`}, // a field it does not know
	{schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, `{"apiVersion":"v1","kind":"ConfigMap"}`},            // a kind it does not know
}

// codecDecode is what decodeTyped does without the hand decoder.
func codecDecode(js []byte, gvk schema.GroupVersionKind) (runtime.Object, error) {
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, err
	}
	strict, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		return nil, err
	}
	if len(strict) > 0 {
		return nil, strict[0]
	}
	return obj, nil
}

// TestFastTypedSameAsCodec: what the hand decoder takes, it decodes to the
// object the codec's strict decoding makes; what it must not take, it
// declines.
func TestFastTypedSameAsCodec(t *testing.T) {
	for _, c := range fastTypedAccepted {
		got, ok := decodeFastTyped([]byte(c.js), c.gvk)
		if !ok {
			t.Errorf("declined:\n%s", c.js)
			continue
		}
		want, err := codecDecode([]byte(c.js), c.gvk)
		if err != nil {
			t.Fatalf("the codec refuses what the hand decoder took: %v\n%s", err, c.js)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("decoded differently:\n hand  %#v\n codec %#v\nfrom %s", got, want, c.js)
		}
	}
	for _, c := range fastTypedDeclined {
		if got, ok := decodeFastTyped([]byte(c.js), c.gvk); ok {
			t.Errorf("took %#v from:\n%s", got, c.js)
		}
	}
}

// FuzzFastTyped: whatever the hand decoder takes, the codec takes too and
// decodes to the same object.
func FuzzFastTyped(f *testing.F) {
	for _, c := range fastTypedAccepted {
		f.Add(c.gvk == serviceGVK, []byte(c.js))
	}
	for _, c := range fastTypedDeclined {
		f.Add(c.gvk == serviceGVK, []byte(c.js))
	}
	f.Fuzz(func(t *testing.T, service bool, js []byte) {
		gvk := endpointSliceGVK
		if service {
			gvk = serviceGVK
		}
		got, ok := decodeFastTyped(js, gvk)
		if !ok {
			return
		}
		want, err := codecDecode(js, gvk)
		if err != nil {
			t.Fatalf("the codec refuses what the hand decoder took: %v\n%q", err, js)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded differently:\n hand  %#v\n codec %#v\nfrom %q", got, want, js)
		}
	})
}
