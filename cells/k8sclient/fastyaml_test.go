package k8sclient

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	sigsyaml "sigs.k8s.io/yaml"
)

// sameAsReference fails the test when the fast converter accepted doc and
// its JSON means something else than the reference converter's, or the
// reference rejects doc.
func sameAsReference(t *testing.T, doc []byte) (accepted bool) {
	t.Helper()
	fast, ok := fastYAMLToJSON(doc)
	if !ok {
		return false
	}
	ref, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		t.Fatalf("fast converter accepted what the reference rejects (%v):\n%s", err, doc)
	}
	var a, b any
	if err := json.Unmarshal(fast, &a); err != nil {
		t.Fatalf("fast converter wrote invalid JSON %s: %v\n%s", fast, err, doc)
	}
	if err := json.Unmarshal(ref, &b); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("fast converter: %s\nreference:      %s\nfor:\n%s", fast, ref, doc)
	}
	return true
}

var typicalManifests = []string{
	`apiVersion: v1
kind: Service
metadata:
  name: web   # the front end
  namespace: default
  labels: {app: web, "app.kubernetes.io/part-of": shop}
  annotations:
    'note': 'it''s here'
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00::10"]
  ipFamilies:
  - IPv4
  - IPv6
  selector: {app: web}
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
  - name: https
    port: 443
    targetPort: "https"
  sessionAffinity: None
`,
	`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
  - name: http
    port: 8080
    protocol: TCP
endpoints:
- addresses:
  - 10.244.0.5
  conditions: {ready: true, serving: false}
  nodeName: node-1
- addresses: [10.244.1.7]
  conditions:
    ready:
  zone: ""
`,
	`apiVersion: v1
kind: Node
metadata:
  name: node-1
spec:
  podCIDRs: [10.244.0.0/24, fd00:10:244::/112]
  taints: []
  unschedulable: false
`,
}

// Typical manifests take the fast path and mean what the reference says.
func TestFastYAMLTypical(t *testing.T) {
	for _, m := range typicalManifests {
		if !sameAsReference(t, []byte(m)) {
			t.Errorf("fast converter declined a typical manifest:\n%s", m)
		}
	}
}

// What the fast converter cannot be sure of, it leaves to the reference.
func TestFastYAMLDeclines(t *testing.T) {
	for _, doc := range []string{
		"a: yes\n", "a: No\n", "a: on\n", "a: ~\n", "a: null\n", "a: True\n", "y: 1\n",
		"a: 0755\n", "a: 0x1f\n", "a: 1_000\n", "a: 1.5\n", "a: 1e3\n", "a: .inf\n", "a: -5\n", "a: +5\n",
		"a: 2001-12-14\n", "a: 12:30\n", "80: http\n",
		"a: &x 1\nb: *x\n", "a: !!str 80\n", "a: |\n  text\n", "a: >-\n  text\n",
		"a: \"esc\\n\"\n", "a: 'open\n", "a: b: c\n", "a: 1\na: 2\n", "{a: 1, a: 2}\n",
		"a: one\n  two\n", "a:\n\t- x\n", "- - x\n", "plain\n", "a: [1,\n  2]\n", "? complex\n: key\n",
		"<<: {a: 1}\n", "a : 1\n", "a: {b:c}\n", "a: [x, ]\n",
	} {
		if _, ok := fastYAMLToJSON([]byte(doc)); ok {
			t.Errorf("fast converter took %q, which it should leave to the reference", doc)
		}
	}
}

// The fast converter agrees with the reference on every input it takes;
// the seeds are the manifests of this package's tests.
func FuzzFastYAMLToJSON(f *testing.F) {
	for _, m := range typicalManifests {
		f.Add([]byte(m))
	}
	files, _ := filepath.Glob("testdata/*.txtar")
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, part := range strings.Split(string(data), "\n---\n") {
			f.Add([]byte(part))
		}
	}
	f.Add(servicesFile("svc", 3, 80))
	f.Fuzz(func(t *testing.T, doc []byte) {
		sameAsReference(t, doc)
	})
}
