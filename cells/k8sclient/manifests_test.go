package k8sclient

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const twoServices = `# Two services and their slice.
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  ports:
  - port: 80
    protocol: TCP
---
apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: kube-system
spec:
  ports:
  - port: 53
    protocol: UDP
--- # the slice
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: ["10.244.1.5"]
`

func TestDecodeFile(t *testing.T) {
	objs, err := newDecoder().decodeFile("services.yaml", []byte(twoServices))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range objs {
		got = append(got, m.key.String()+" "+m.key.resource.String())
	}
	want := []string{
		"Service default/web /v1, Resource=services",
		"Service kube-system/dns /v1, Resource=services",
		"EndpointSlice default/web-1 discovery.k8s.io/v1, Resource=endpointslices",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The line is that of the object's first line, past comments.
	for i, want := range []struct{ line, doc int32 }{{2, 1}, {11, 2}, {21, 3}} {
		if objs[i].line != want.line || objs[i].doc != want.doc {
			t.Errorf("%s at line %d document %d, want line %d document %d", objs[i].key, objs[i].line, objs[i].doc, want.line, want.doc)
		}
	}
	first := decodedObject(t, objs[0])
	svc, ok := first.(*corev1.Service)
	if !ok || svc.Namespace != "default" || svc.Spec.Ports[0].Port != 80 || svc.Kind != "Service" {
		t.Errorf("first object = %#v, want Service default/web with port 80", first)
	}
	third := decodedObject(t, objs[2])
	if slice, ok := third.(*discoveryv1.EndpointSlice); !ok || slice.Endpoints[0].Addresses[0] != "10.244.1.5" {
		t.Errorf("third object = %#v, want the EndpointSlice with 10.244.1.5", third)
	}
}

// decodedObject is the object m holds encoded.
func decodedObject(t *testing.T, m decoded) runtime.Object {
	t.Helper()
	obj, err := decodeEncoded(m.gvk(), m.encoded)
	if err != nil {
		t.Fatalf("%s: %v", m.key, err)
	}
	return obj
}

func TestDecodeFileEmptyDocuments(t *testing.T) {
	data := "---\n# nothing here\n---\n\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n---\n"
	objs, err := newDecoder().decodeFile("ns.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].key.String() != "Namespace apps" || objs[0].line != 6 || objs[0].doc != 1 {
		t.Fatalf("got %d objects, first %v at line %d document %d; want Namespace apps at line 6 document 1",
			len(objs), objs[0].key, objs[0].line, objs[0].doc)
	}
}

// Every error names the file, the line of the problem and the document.
func TestDecodeFileErrors(t *testing.T) {
	const svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n"
	tests := []struct {
		name, data, want string
	}{{
		name: "yaml syntax in the second document",
		data: svc + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: dns\n   namespace: x\n",
		want: "f.yaml:10: document 2: yaml: mapping values are not allowed in this context",
	}, {
		name: "key given twice",
		data: svc + "spec:\n  type: ClusterIP\n  type: NodePort\n",
		want: `f.yaml:7: document 1: yaml: unmarshal errors: key "type" already set in map`,
	}, {
		name: "missing kind and name",
		data: "# leading comment\napiVersion: v1\nmetadata:\n  labels: {a: b}\n",
		want: "f.yaml:2: document 1: missing kind, metadata.name: every object needs apiVersion, kind and metadata.name",
	}, {
		name: "not a mapping",
		data: "- a\n- b\n",
		want: "f.yaml:1: document 1: not an object: want a mapping with apiVersion, kind and metadata",
	}, {
		name: "metadata not a mapping",
		data: "apiVersion: v1\nkind: Service\nmetadata: web\n",
		want: "f.yaml:1: document 1: apiVersion and kind must be strings, metadata a mapping with a name",
	}, {
		name: "unknown kind",
		data: svc + "---\napiVersion: v1\nkind: Servce\nmetadata: {name: x}\n",
		want: `f.yaml:7: document 2: unknown kind "Servce" in v1: not a built-in Kubernetes kind`,
	}, {
		name: "kind of an API group embedded mode does not serve",
		data: svc + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
		want: `f.yaml:6: document 2: Deployment x: apps/v1 is not served in embedded mode, which serves the API groups the agent reads (v1, discovery.k8s.io/v1, networking.k8s.io/v1, coordination.k8s.io/v1)`,
	}, {
		name: "misspelt field",
		data: svc + "spec:\n  ports:\n  - port: 80\n  - port: 81\n    protcol: TCP\n",
		want: `f.yaml:9: document 1: Service web: strict decoding error: unknown field "spec.ports[1].protcol"`,
	}, {
		name: "wrong type in the only item of a list",
		data: svc + "spec:\n  ports:\n  - name: http\n    port: eighty\n",
		want: "f.yaml:8: document 1: Service web: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32",
	}, {
		name: "wrong type in one of several items: the list's line",
		data: svc + "spec:\n  ports:\n  - port: 80\n  - port: eighty\n",
		want: "f.yaml:6: document 1: Service web: json: cannot unmarshal string into Go struct field ServicePort.spec.ports.port of type int32",
	}, {
		name: "namespace on a cluster-scoped kind",
		data: "apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  namespace: default\n",
		want: "f.yaml:5: document 1: Node n1 is cluster-scoped: remove metadata.namespace",
	}, {
		name: "a List",
		data: "apiVersion: v1\nkind: List\nitems: []\n",
		want: "f.yaml:2: document 1: kind List holds several objects: put each in its own --- document",
	}, {
		name: "the same object twice",
		data: svc + "---\n" + svc,
		want: "f.yaml:6: document 2: Service default/web is already defined at line 1 of this file",
	}, {
		name: "content after the separator",
		data: svc + "--- {a: b}\n",
		want: `f.yaml:5: invalid document separator "--- {a: b}": put nothing but a comment after ---`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := newDecoder().decodeFile("f.yaml", []byte(tt.data))
			if err == nil {
				t.Fatalf("decoded %d objects, want error %q", len(objs), tt.want)
			}
			if err.Error() != tt.want {
				t.Fatalf("error:\n got %s\nwant %s", err, tt.want)
			}
		})
	}
}

// typicalManifests are manifests as people write them: comments, flow
// and block collections, quoted scalars, two address families.
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

// FuzzDecodeFile: whatever a manifest file holds, decoding it never panics;
// it gives objects that each have a name and the file, or an error that
// names the file.
func FuzzDecodeFile(f *testing.F) {
	for _, m := range typicalManifests {
		f.Add([]byte(m))
	}
	f.Add(servicesFile("svc", 2, 80))
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: [broken\n"))
	f.Add([]byte("---\n---\nkind: Pod\n"))
	f.Add([]byte("{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"x\"}}"))
	d := newDecoder()
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := d.decodeFile("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			if objs != nil {
				t.Fatalf("objects beside an error: %d", len(objs))
			}
			return
		}
		for _, m := range objs {
			if m.key.name == "" || *m.file != "fuzz.yaml" || m.encoded == nil || m.doc < 1 {
				t.Fatalf("decoded object without a name, file or document: %+v", m)
			}
		}
	})
}
