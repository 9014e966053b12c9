package k8sclient

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fastPathManifests are files whose documents take the fast paths
// (fastYAMLConvert, decodeTyped) or only just miss them: quoting, anchors,
// flow collections, comments, several documents, apiVersion and kind spelt
// or placed unusually, and bad input.
var fastPathManifests = []string{
	string(scaleManifests(3)),
	// Quoted header values and keys; comments; a separator with a comment.
	`# leading comment
"apiVersion": 'v1'
kind: "Service" # trailing
metadata: {name: q, namespace: "ns-1", labels: {"a.b/c": 'x y', d: "1"}}
spec:
  ports:
  - {port: 80, targetPort: "http"}
--- # next
apiVersion: v1
kind: ConfigMap
metadata:
  name: cm
data:
  "on": "yes"
  k: 'it''s'
  n: "012"
`,
	// Anchors and aliases, a block scalar, a tag: the reference converter.
	`apiVersion: v1
kind: ConfigMap
metadata: &m
  name: anchored
data:
  a: &v value
  b: *v
  c: |
    line one
    line two
  d: !!str 12
`,
	// apiVersion and kind in flow style, last, or at once.
	`{apiVersion: v1, kind: Namespace, metadata: {name: flow}}
---
metadata:
  name: last
kind: Namespace
apiVersion: v1
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: es, namespace: x, labels: {kubernetes.io/service-name: s}}
addressType: IPv4
endpoints:
- addresses: ["10.0.0.1"]
  conditions: {ready: true, serving: false}
  zone: z
ports: [{name: "", port: 53, protocol: UDP}]
`,
	// Pod, Node, Namespace with numbers, booleans and empty values.
	`apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 30
  containers:
  - name: c
    image: "busybox:1.36"
    args: ["sleep", "3600"]
    ports:
    - containerPort: 8080
      protocol: TCP
    resources:
      limits: {cpu: 100m, memory: 64Mi}
  nodeSelector: {}
---
apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels:
    kubernetes.io/hostname: node-1
spec:
  podCIDR: 10.244.1.0/24
  podCIDRs: [10.244.1.0/24]
  unschedulable: false
`,
	// Kinds and versions spelt in ways the codec judges: a case variant of
	// a header key, an unknown kind, a list kind, a version that is a
	// number, a YAML 1.1 word.
	"apiVersion: v1\nKind: Service\nkind: Service\nmetadata: {name: a}\n",
	"apiVersion: v1\nkind: Servise\nmetadata: {name: a}\n",
	"apiVersion: v1\nkind: ServiceList\nitems: []\n",
	"apiVersion: 1\nkind: Service\nmetadata: {name: a}\n",
	"apiVersion: v1\nkind: yes\nmetadata: {name: a}\n",
	"apiVersion: a/b/c\nkind: Service\nmetadata: {name: a}\n",
	"apiVersion: apps/\nkind: Deployment\nmetadata: {name: a}\n",
	// Unknown and duplicate fields, wrong types.
	"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {portz: []}\n",
	"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: http}]}\n",
	"apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  type: ClusterIP\n  type: NodePort\n",
	"apiVersion: v1\nkind: Service\nmetadata: {name: a, name: b}\n",
	"apiVersion: v1\nkind: Service\nmetadata: {namespace: a}\n",
	"apiVersion: v1\nkind: Namespace\nmetadata: {name: a, namespace: b}\n",
	"- apiVersion: v1\n  kind: Namespace\n",
	// Scalars of digits and dots: strings, numbers, or left to the reference.
	"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: 1.2.3, b: ..1, c: 1..2, d: 10.0.0.1}\n",
	"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: 1.2}\n",
	"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: .5}\n",
}

// TestFastDecodeSameAsGeneric: the fast paths give the same objects
// (encodings, keys, lines, documents) and the same errors as the reference
// path, the YAML converter kubectl uses and client-go's codec.
func TestFastDecodeSameAsGeneric(t *testing.T) {
	fast, generic := newDecoder(), newDecoder()
	generic.generic = true
	files := append([]string{}, fastPathManifests...)
	files = append(files, typicalManifests...)
	for i, data := range files {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			got, gotErr := fast.decodeFile("f.yaml", []byte(data))
			want, wantErr := generic.decodeFile("f.yaml", []byte(data))
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("error:\n fast    %v\n generic %v\nfor:\n%s", gotErr, wantErr, data)
			}
			if len(got) != len(want) {
				t.Fatalf("fast path gave %d objects, generic %d", len(got), len(want))
			}
			for j := range got {
				g, w := got[j], want[j]
				if g.key != w.key || g.digest != w.digest || string(g.encoded) != string(w.encoded) ||
					*g.file != *w.file || g.line != w.line || g.doc != w.doc {
					t.Fatalf("object %d:\n fast    %+v %s\n generic %+v %s", j, *g.manifest, *g.file, *w.manifest, *w.file)
				}
			}
		})
	}
}

// TestFastDecodeTakesFastPath: the benchmark's manifests do take the typed
// fast path (else the test above compares the generic path with itself).
func TestFastDecodeTakesFastPath(t *testing.T) {
	d := newDecoder()
	docs, err := splitDocuments("f.yaml", scaleManifests(1))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		js, th, ok := fastYAMLConvert(doc.data)
		if !ok {
			t.Fatalf("fast converter declined:\n%s", doc.data)
		}
		if _, _, ok := d.decodeTyped(js, th); !ok {
			t.Fatalf("typed decode declined %+v:\n%s", th, doc.data)
		}
		gvk := schema.FromAPIVersionAndKind(th.apiVersion, th.kind)
		if _, ok := decodeFastTyped(js, gvk); !ok {
			t.Fatalf("the hand decoder declined %v:\n%s", gvk, js)
		}
	}
}

// TestIsPlainKey: isPlainKey accepts what the regular expression it
// replaces accepts.
func TestIsPlainKey(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_./-]*$`)
	const alphabet = "aZ09_./-: \"'#{é\x00"
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		var sb strings.Builder
		for range r.IntN(6) {
			sb.WriteString(string([]rune(alphabet)[r.IntN(len([]rune(alphabet)))]))
		}
		s := sb.String()
		if isPlainKey(s) != re.MatchString(s) {
			t.Fatalf("isPlainKey(%q) = %v, the regular expression says %v", s, isPlainKey(s), re.MatchString(s))
		}
	}
}
